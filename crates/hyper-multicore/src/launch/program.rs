//! Finding the program a PE runs: hmrun checks it before anything is started, and
//! [`PeCommand::spawn`](super::PeCommand::spawn) resolves it the same way.
//!
//! The lookup follows `execvp`: a name containing `/` is a path; any other name is searched in
//! the directories of `PATH` (an empty entry meaning the current directory; `/bin:/usr/bin`
//! when `PATH` is unset), and the first executable regular file wins. Checking up front turns
//! a typo into one clear message instead of N failed ranks.
//!
//! ```text
//! $ hmrun -n 2 pyhton train.py
//! hmrun: program 'pyhton' not found in PATH
//! ```

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};

use rustix::fs::{access, Access};

/// The search path `execvp` uses when `PATH` is unset.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Why a program cannot be run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramError {
    /// A bare name that no directory of `PATH` holds as an executable file.
    NotInPath(OsString),
    /// A path naming nothing.
    Missing(PathBuf),
    /// A path naming something other than a regular file (a directory, say).
    NotAFile(PathBuf),
    /// A path naming a file the caller may not execute.
    NotExecutable(PathBuf),
}

impl From<ProgramError> for std::io::Error {
    fn from(error: ProgramError) -> std::io::Error {
        let kind = match error {
            ProgramError::NotInPath(_) | ProgramError::Missing(_) => std::io::ErrorKind::NotFound,
            ProgramError::NotAFile(_) | ProgramError::NotExecutable(_) => {
                std::io::ErrorKind::PermissionDenied
            }
        };
        std::io::Error::new(kind, error)
    }
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramError::NotInPath(name) => {
                write!(f, "program '{}' not found in PATH", name.to_string_lossy())
            }
            ProgramError::Missing(path) => {
                write!(f, "program '{}' does not exist", path.display())
            }
            ProgramError::NotAFile(path) => {
                write!(f, "program '{}' is not a regular file", path.display())
            }
            ProgramError::NotExecutable(path) => {
                write!(f, "program '{}' is not executable", path.display())
            }
        }
    }
}

impl std::error::Error for ProgramError {}

/// Resolves `program` to the path that will be executed, searching `search_path` (the value of
/// `PATH`, if set) for a name without `/`.
pub fn resolve(program: &OsStr, search_path: Option<&OsStr>) -> Result<PathBuf, ProgramError> {
    let as_path = Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return check_executable(as_path).map(|()| as_path.to_path_buf());
    }
    let search_path = search_path.unwrap_or(OsStr::new(DEFAULT_PATH));
    std::env::split_paths(search_path)
        .map(|dir| {
            // An empty entry is the current directory; keep a `/` in the result so that
            // executing it never searches PATH a second time.
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            dir.join(as_path)
        })
        .find(|candidate| check_executable(candidate).is_ok())
        .ok_or_else(|| ProgramError::NotInPath(program.to_os_string()))
}

/// Checks that `path` is a regular file the caller may execute (following symlinks).
fn check_executable(path: &Path) -> Result<(), ProgramError> {
    let metadata =
        std::fs::metadata(path).map_err(|_| ProgramError::Missing(path.to_path_buf()))?;
    if !metadata.is_file() {
        return Err(ProgramError::NotAFile(path.to_path_buf()));
    }
    access(path, Access::EXEC_OK).map_err(|_| ProgramError::NotExecutable(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_are_searched_in_path() {
        let found = resolve(OsStr::new("sh"), Some(OsStr::new("/nonexistent:/bin"))).unwrap();
        assert_eq!(found, Path::new("/bin/sh"));
    }

    #[test]
    fn unset_path_falls_back_to_the_default() {
        assert_eq!(
            resolve(OsStr::new("sh"), None).unwrap(),
            Path::new("/bin/sh")
        );
    }

    #[test]
    fn unknown_names_are_reported() {
        let err = resolve(
            OsStr::new("no-such-program-hmrun"),
            Some(OsStr::new("/bin")),
        );
        assert_eq!(
            err.unwrap_err().to_string(),
            "program 'no-such-program-hmrun' not found in PATH"
        );
    }

    #[test]
    fn paths_are_checked_not_searched() {
        assert_eq!(
            resolve(OsStr::new("/bin/sh"), Some(OsStr::new(""))).unwrap(),
            Path::new("/bin/sh")
        );
        assert!(matches!(
            resolve(OsStr::new("./no-such-program"), None),
            Err(ProgramError::Missing(_))
        ));
        assert!(matches!(
            resolve(OsStr::new("/"), None),
            Err(ProgramError::NotAFile(_))
        ));
    }

    #[test]
    fn files_without_execute_permission_are_refused() {
        // Cargo.toml is a regular file that nobody may execute.
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        assert_eq!(
            resolve(OsStr::new(manifest), None),
            Err(ProgramError::NotExecutable(PathBuf::from(manifest)))
        );
    }
}
