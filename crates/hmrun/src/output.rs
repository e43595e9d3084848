//! Prefixing the ranks' output with their rank.
//!
//! Every pipe of every rank gets one thread that copies it line by line to hmrun's own stdout
//! or stderr as `[rank] line`. A line is written with one `write_all` while the stream's lock
//! is held, so lines of different ranks never mix mid-line. Bytes pass through unchanged (no
//! UTF-8 decoding); a last line without a newline is printed at end of file with one added.
//!
//! ```text
//! $ hmrun -n 2 sh -c 'echo hello from $RANK'
//! [0] hello from 0
//! [1] hello from 1
//! ```

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::thread::{self, JoinHandle};

/// Which of hmrun's own streams a rank's pipe is copied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// hmrun's standard output (for the ranks' stdout).
    Stdout,
    /// hmrun's standard error (for the ranks' stderr).
    Stderr,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Destination::Stdout => "stdout",
            Destination::Stderr => "stderr",
        })
    }
}

/// Starts a thread that copies `pipe` to `destination`, every line prefixed with `[rank] `.
///
/// The thread ends at end of file. If writing to `destination` fails (for example hmrun's
/// stdout is a closed pipe), it stops reading and closes `pipe`, so the rank sees the same
/// broken pipe it would see writing there directly.
pub fn spawn_prefixer(
    rank: usize,
    pipe: impl Read + Send + 'static,
    destination: Destination,
) -> io::Result<JoinHandle<()>> {
    thread::Builder::new()
        .name(format!("rank {rank} {destination}"))
        .spawn(move || {
            // An error ends the copy; there is nobody left to tell (see above).
            let _ = match destination {
                Destination::Stdout => copy_prefixed(rank, pipe, |line| {
                    let mut out = io::stdout().lock();
                    out.write_all(line)?;
                    out.flush()
                }),
                Destination::Stderr => {
                    copy_prefixed(rank, pipe, |line| io::stderr().lock().write_all(line))
                }
            };
        })
}

/// Reads whole lines from `input` and hands each one, as `[rank] line\n`, to `write_line`.
fn copy_prefixed(
    rank: usize,
    input: impl Read,
    mut write_line: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut input = BufReader::new(input);
    // The line is read into the buffer right after the prefix, so each line is one write.
    let mut line = format!("[{rank}] ").into_bytes();
    let prefix_len = line.len();
    loop {
        line.truncate(prefix_len);
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        write_line(&line)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixed(rank: usize, input: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        copy_prefixed(rank, input, |line| {
            lines.push(line.to_vec());
            Ok(())
        })
        .unwrap();
        lines
    }

    #[test]
    fn every_line_gets_the_prefix() {
        assert_eq!(
            prefixed(3, b"one\ntwo\n"),
            [b"[3] one\n".to_vec(), b"[3] two\n".to_vec()]
        );
    }

    #[test]
    fn a_partial_last_line_is_completed() {
        assert_eq!(
            prefixed(0, b"done\npartial"),
            [b"[0] done\n".to_vec(), b"[0] partial\n".to_vec()]
        );
    }

    #[test]
    fn empty_input_writes_nothing_and_empty_lines_stay() {
        assert!(prefixed(1, b"").is_empty());
        assert_eq!(prefixed(12, b"\n"), [b"[12] \n".to_vec()]);
    }

    #[test]
    fn bytes_pass_through_unchanged() {
        assert_eq!(
            prefixed(2, b"\xff\xfe raw\r\n"),
            [b"[2] \xff\xfe raw\r\n".to_vec()]
        );
    }

    #[test]
    fn a_write_error_stops_the_copy() {
        let mut calls = 0;
        let result = copy_prefixed(0, &b"a\nb\n"[..], |_| {
            calls += 1;
            Err(io::ErrorKind::BrokenPipe.into())
        });
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(calls, 1);
    }
}
