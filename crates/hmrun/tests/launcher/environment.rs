//! Every rank gets the world environment of `JobPlan`.

use crate::support::run;

#[test]
fn each_rank_sees_its_own_world_environment() {
    let script = r#"
        fd=${HYPER_MULTICORE_WORLD_LISTEN_FD-unset}
        open=no
        [ "$fd" != unset ] && [ -e "/proc/$$/fd/$fd" ] && open=yes
        echo "rank=$HYPER_MULTICORE_RANK size=$HYPER_MULTICORE_WORLD_SIZE local=$HYPER_MULTICORE_LOCAL_RANK torch=$RANK/$WORLD_SIZE/$LOCAL_RANK fd_open=$open"
        echo "id=$HYPER_MULTICORE_WORLD_ID"
        echo "fd=$fd"
    "#;
    let size = 3;
    let finished = run(
        "environment",
        &["-n", &size.to_string(), "sh", "-c", script],
    );
    assert_eq!(finished.code(), 0, "{finished:#?}");
    let lines = finished.stdout_lines();
    let line_of = |rank: usize, key: &str| -> String {
        let prefix = format!("[{rank}] {key}");
        let matching: Vec<_> = lines.iter().filter(|l| l.starts_with(&prefix)).collect();
        assert_eq!(matching.len(), 1, "rank {rank}, {key}: {lines:#?}");
        matching[0][prefix.len()..].to_string()
    };
    let id = line_of(0, "id=");
    assert!(!id.is_empty(), "empty HYPER_MULTICORE_WORLD_ID: {lines:#?}");
    for rank in 0..size {
        let fd_open = if rank == 0 { "yes" } else { "no" };
        assert_eq!(
            line_of(rank, "rank="),
            format!("{rank} size={size} local={rank} torch={rank}/{size}/{rank} fd_open={fd_open}")
        );
        assert_eq!(line_of(rank, "id="), id, "world ids differ");
        let fd = line_of(rank, "fd=");
        if rank == 0 {
            assert!(fd.parse::<u32>().is_ok(), "rank 0 got fd={fd}");
        } else {
            assert_eq!(fd, "unset", "rank {rank} must not get the listener");
        }
    }
}
