//! Starting a PE process that dies with its launcher, without copying the launcher.
//!
//! `Command::spawn` with a `pre_exec` hook (the only way std offers to arm
//! `PR_SET_PDEATHSIG` in the child) forks: the child gets a copy of the launcher's page tables,
//! which its `exec` then throws away, a cost every PE of a large job pays at start-up. This
//! module does what glibc's `posix_spawn` does instead — `clone(CLONE_VM |
//! CLONE_VFORK)`: the child runs on its own small stack in the launcher's memory, the
//! launcher's thread waits until the child has called `execve` (or failed) — and runs the few
//! system calls a PE needs on the way: parent-death signal, process group, standard streams,
//! the inherited listener, default signal dispositions and an empty signal mask (as std's
//! `Command` leaves a child).
//!
//! Everything the child needs is prepared by the launcher beforehand (paths, argument and
//! environment arrays, descriptors), so the child only makes system calls: it allocates
//! nothing, takes no lock and never returns into Rust code of the launcher.

use std::ffi::{c_char, c_int, c_void, CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

/// The child's stack: it runs a handful of system-call wrappers, then `execve`.
const CHILD_STACK: usize = 64 * 1024;

/// What the child process is to be: resolved and encoded by [`spawn`] before the clone.
pub(crate) struct Spawn<'a> {
    /// The program's path (the caller resolved a bare name in the child's `PATH`).
    pub(crate) path: &'a Path,
    /// `argv[0]`, then the arguments.
    pub(crate) argv: Vec<&'a OsStr>,
    /// The child's whole environment, as (name, value) pairs.
    pub(crate) env: Vec<(OsString, OsString)>,
    /// The descriptors to install as the child's standard input, output and error (`None`:
    /// inherit the launcher's).
    pub(crate) stdio: [Option<RawFd>; 3],
    /// Put the child in a process group of its own.
    pub(crate) process_group: bool,
    /// A descriptor kept open across `exec`, at the same number, in the child only.
    pub(crate) inherit: Option<RawFd>,
}

/// The child's instructions, read by [`child_main`] in the launcher's memory.
#[repr(C)]
struct ChildPlan {
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    stdio: [c_int; 3],
    inherit: c_int,
    process_group: bool,
    parent: libc::pid_t,
    /// Written by the child when a step fails: the `errno`, before it exits.
    error: c_int,
}

/// Starts the process `spawn` describes, dying with the calling thread's process; returns its
/// process ID once it has executed the program (an `exec` failure, a missing program among
/// them, is this call's error).
pub(crate) fn spawn(spawn: &Spawn<'_>) -> std::io::Result<u32> {
    let path = c_string(spawn.path.as_os_str().as_bytes())?;
    let argv = spawn
        .argv
        .iter()
        .map(|arg| c_string(arg.as_bytes()))
        .collect::<std::io::Result<Vec<CString>>>()?;
    let envp = spawn
        .env
        .iter()
        .map(|(name, value)| {
            let mut entry = name.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            c_string(&entry)
        })
        .collect::<std::io::Result<Vec<CString>>>()?;
    let argv_pointers = null_terminated(&argv);
    let envp_pointers = null_terminated(&envp);
    // A descriptor below 3 would be overwritten by another's `dup2` in the child (a launcher
    // started with a standard stream closed): give each a number of 3 or more.
    let mut raised: Vec<OwnedFd> = Vec::new();
    let mut stdio = [-1; 3];
    for (slot, fd) in stdio.iter_mut().zip(spawn.stdio) {
        *slot = match fd {
            None => -1,
            Some(fd) if fd >= 3 => fd,
            Some(fd) => {
                // SAFETY: `fd` is a descriptor the caller keeps open for this call.
                let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                let copy = rustix::io::fcntl_dupfd_cloexec(borrowed, 3)?;
                raised.push(copy);
                raised.last().expect("just pushed").as_raw_fd()
            }
        };
    }
    let mut plan = ChildPlan {
        path: path.as_ptr(),
        argv: argv_pointers.as_ptr(),
        envp: envp_pointers.as_ptr(),
        stdio,
        inherit: spawn.inherit.unwrap_or(-1),
        process_group: spawn.process_group,
        parent: std::process::id() as libc::pid_t,
        error: 0,
    };
    let mut stack = vec![0u128; CHILD_STACK / 16];
    // SAFETY: one past the end of the stack buffer (16-byte aligned: `u128` elements); the
    // stack grows down from there and the buffer outlives the child's use of it (below).
    let top = unsafe { stack.as_mut_ptr().add(stack.len()) }.cast::<c_void>();
    let pid = {
        let _blocked = SignalsBlocked::new();
        // SAFETY: `CLONE_VM | CLONE_VFORK`: the child shares this memory and this thread is
        // suspended until the child has called `execve` or exited, so `plan`, the strings it
        // points to and `stack` stay valid and untouched for the child's whole use of them.
        // The child runs `child_main`, which only makes async-signal-safe system calls, with
        // every signal blocked until it has reset the handlers (none of this process's
        // handlers runs in it).
        unsafe {
            libc::clone(
                child_main,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::addr_of_mut!(plan).cast::<c_void>(),
            )
        }
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(stack);
    drop(raised);
    // SAFETY: the child has exec'd or exited (`CLONE_VFORK`); it wrote `error` before that.
    let error = unsafe { std::ptr::read_volatile(std::ptr::addr_of!(plan.error)) };
    if error != 0 {
        // The child exits at once (status 127); reap it so no zombie stays behind.
        let _ = wait(pid as u32);
        return Err(std::io::Error::from_raw_os_error(error));
    }
    Ok(pid as u32)
}

/// Waits for process `pid` (a child of this process) to end and reaps it.
pub(crate) fn wait(pid: u32) -> std::io::Result<ExitStatus> {
    let mut status: c_int = 0;
    loop {
        // SAFETY: `status` is a valid `int` to write; `waitpid` touches nothing else.
        let waited = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        if waited >= 0 {
            return Ok(ExitStatus::from_raw(status));
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// The child: runs on its own stack in the launcher's memory with every signal blocked, until
/// it executes the program. Only system calls; on a failure it records `errno` and exits.
extern "C" fn child_main(argument: *mut c_void) -> c_int {
    let plan = argument.cast::<ChildPlan>();
    // SAFETY: `plan` is the launcher's `ChildPlan`, valid while the launcher's thread waits
    // (`CLONE_VFORK`); the child reads it and writes only its `error` field. Every call is a
    // plain system-call wrapper with valid pointers to locals or to the plan's strings.
    unsafe {
        // No handler of the launcher may run here (it would run on this shared memory): every
        // caught signal gets its default action, as does SIGPIPE (which Rust programs ignore).
        for signal in 1..=libc::SIGRTMAX() {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            let handled =
                current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN;
            if handled || signal == libc::SIGPIPE {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            fail(plan);
        }
        if libc::getppid() != (*plan).parent {
            // The launcher died before the death signal was armed.
            *libc::__errno_location() = libc::ESRCH;
            fail(plan);
        }
        if (*plan).process_group && libc::setpgid(0, 0) != 0 {
            fail(plan);
        }
        for (target, fd) in (0..).zip((*plan).stdio) {
            if fd >= 0 && libc::dup2(fd, target) < 0 {
                fail(plan);
            }
        }
        let inherit = (*plan).inherit;
        if inherit >= 0 && libc::fcntl(inherit, libc::F_SETFD, 0) != 0 {
            fail(plan);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve((*plan).path, (*plan).argv, (*plan).envp);
        fail(plan)
    }
}

/// Records `errno` in the plan (for the launcher) and ends the child.
///
/// # Safety
///
/// `plan` is the launcher's `ChildPlan` of this child (see [`child_main`]).
unsafe fn fail(plan: *mut ChildPlan) -> ! {
    // SAFETY: the caller's contract; `errno` is this thread's (the launcher's thread is
    // suspended and does not read it until the child is gone).
    unsafe {
        let error = *libc::__errno_location();
        std::ptr::write_volatile(std::ptr::addr_of_mut!((*plan).error), error.max(1));
        libc::_exit(127)
    }
}

/// Every signal blocked on this thread while it lives (the launcher's side of a clone: no
/// handler may run in the child before it has reset them).
struct SignalsBlocked {
    previous: libc::sigset_t,
}

impl SignalsBlocked {
    fn new() -> SignalsBlocked {
        // SAFETY: both sets are valid locals; blocking signals has no other effect.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
            SignalsBlocked { previous }
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `new`, a valid set.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut());
        }
    }
}

fn c_string(bytes: &[u8]) -> std::io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{:?} contains a NUL byte, which no program argument or environment entry may",
                String::from_utf8_lossy(bytes)
            ),
        )
    })
}

/// The pointers of `strings`, then a null pointer (an `argv` or `envp` array).
fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}
