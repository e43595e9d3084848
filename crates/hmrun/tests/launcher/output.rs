//! Output prefixing: whole lines, each with its rank, stdout to stdout and stderr to stderr.

use crate::support::{ranks_printing, run};

#[test]
fn every_line_is_prefixed_with_its_rank() {
    let script = r#"echo "a $RANK"; echo "b $RANK"; echo "err $RANK" >&2; printf "tail $RANK""#;
    let finished = run("prefix", &["-n", "3", "sh", "-c", script]);
    assert_eq!(finished.code(), 0, "{finished:#?}");
    let stdout = finished.stdout_lines();
    assert_eq!(stdout.len(), 9, "{finished:#?}");
    for rank in 0..3 {
        let own: Vec<_> = stdout
            .iter()
            .filter(|l| l.starts_with(&format!("[{rank}] ")))
            .cloned()
            .collect();
        assert_eq!(
            own,
            [
                format!("[{rank}] a {rank}"),
                format!("[{rank}] b {rank}"),
                format!("[{rank}] tail {rank}"),
            ],
            "{finished:#?}"
        );
        assert_eq!(
            ranks_printing(&finished.stderr, &format!("err {rank}")),
            [rank]
        );
    }
    assert_eq!(finished.stderr_lines().len(), 3, "{finished:#?}");
    assert!(
        finished.stdout.ends_with(b"\n"),
        "the partial line was not completed"
    );
}

#[test]
fn lines_of_different_ranks_never_mix() {
    let (size, count) = (4, 400);
    let script = format!(
        r#"i=0; while [ $i -lt {count} ]; do echo "rank $RANK line $i {}"; i=$((i+1)); done"#,
        "x".repeat(200)
    );
    let finished = run(
        "interleave",
        &["-n", &size.to_string(), "sh", "-c", &script],
    );
    assert_eq!(finished.code(), 0, "{finished:#?}");
    let mut next = vec![0; size];
    for line in finished.stdout_lines() {
        let (prefix, rest) = line.split_once("] ").expect("a line without prefix");
        let rank: usize = prefix
            .trim_start_matches('[')
            .parse()
            .expect("a bad prefix");
        let expected = format!("rank {rank} line {} {}", next[rank], "x".repeat(200));
        assert_eq!(rest, expected, "a mixed or reordered line");
        next[rank] += 1;
    }
    assert_eq!(next, vec![count; size]);
}

#[test]
fn bytes_that_are_not_utf8_pass_through() {
    let finished = run("raw", &["-n", "1", "sh", "-c", r"printf '\377\376 raw\n'"]);
    assert_eq!(finished.code(), 0, "{finished:#?}");
    assert_eq!(finished.stdout, b"[0] \xff\xfe raw\n");
}
