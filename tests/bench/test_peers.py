"""The peers benchmark's own code: ours end to end on a tiny workload (a timed run and a
kill -9 run), and the read-back check, the W&B file reader, the process-tree kill and
the table on made-up inputs (the peers themselves need their venvs and minutes)."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import _peer_worker as worker
from bench import peers


def test_one_timed_run_of_ours_checks_every_point() -> None:
    result = peers.run_peer(sys.executable, "tracker", keys=3, steps=300, timeout=120)
    assert "error" not in result, result
    assert result["check_ok"], result["check"]
    assert result["points"] == result["points_logged"] == 900  # every point read back and compared
    assert result["read_points"] == 300  # the timed read: one key, every step
    assert result["us_per_point"] > 0 and result["disk_bytes"] > 0 and result["cpu_s"] > 0
    assert 0 <= result["close_s"] <= result["queryable_s"]


def test_a_killed_run_of_ours_keeps_what_was_flushed() -> None:
    # our flush interval is 1 s: 3 s after the last log() every row is in a chunk
    result = peers.kill_peer(sys.executable, "tracker", keys=2, steps=200, kill_after=3.0, timeout=120)
    assert "error" not in result, result
    assert result["check_ok"], result["check"]
    assert result["points"] == result["points_logged"] == 400
    assert result["kill_after_s"] == 3.0


def dicts() -> list[dict[str, float]]:
    return worker.workload(keys=2, steps=4)


def points(rows: list[dict[str, float]]) -> worker.Points:
    return {k: [(s, d[k]) for s, d in enumerate(rows)] for k in rows[0]}


def test_the_check_passes_an_exact_read_back() -> None:
    assert worker.check(dicts(), points(dicts()), "float64", complete=True) == (True, "", 8)


def test_the_check_names_the_first_wrong_value() -> None:
    got = points(dicts())
    step, value = got["loss/k1"][2]
    got["loss/k1"][2] = (step, value + 1e-12)
    ok, why, _ = worker.check(dicts(), got, "float64", complete=True)
    assert not ok and why.startswith("loss/k1 step 2: logged ")


def test_the_check_refuses_a_missing_point_only_when_complete() -> None:
    got = points(dicts())
    del got["loss/k0"][3]
    assert worker.check(dicts(), got, "float64", complete=False) == (True, "", 7)  # what a kill left
    ok, why, _ = worker.check(dicts(), got, "float64", complete=True)
    assert not ok and why == "loss/k0: logged 4 points, read 3"


def test_the_check_refuses_duplicates_and_strangers() -> None:
    got = points(dicts())
    got["loss/k0"].append(got["loss/k0"][0])
    assert worker.check(dicts(), got, "float64", complete=False)[1] == "loss/k0 step 0 read twice"
    assert worker.check(dicts(), {"loss/zz": [(0, 1.0)]}, "float64", complete=False)[1] == \
        "key 'loss/zz' was never logged"
    assert worker.check(dicts(), {"loss/k0": [(9, 1.0)]}, "float64", complete=False)[1] == \
        "loss/k0 step 9 was never logged"


def test_float32_values_match_only_a_float32_peer() -> None:
    rounded = {k: [(s, struct.unpack("<f", struct.pack("<f", v))[0]) for s, v in pts]
               for k, pts in points(dicts()).items()}
    assert worker.check(dicts(), rounded, "float32", complete=True)[0]
    assert not worker.check(dicts(), rounded, "float64", complete=True)[0]


def leveldb_log(records: list[bytes]) -> bytes:
    """W&B's offline file: a 7-byte header, then LevelDB log records in 32 KiB blocks."""
    out = bytearray(b":W&B\x00\x00\x00")
    for rec in records:
        first = True
        while True:
            room = 32768 - len(out) % 32768
            if room < 7:
                out += b"\x00" * room
                continue
            chunk, rec = rec[:room - 7], rec[room - 7:]
            kind = (1 if not rec else 2) if first else (4 if not rec else 3)
            out += struct.pack("<IHB", 0, len(chunk), kind) + chunk
            first = False
            if not rec:
                break
    return bytes(out)


def test_the_wandb_reader_joins_split_records_and_stops_at_a_torn_one() -> None:
    records = [b"a" * 10, b"b" * 40_000, b"c" * 5]  # the second spans two blocks
    data = leveldb_log(records)
    assert list(worker.wandb_records(data)) == records
    assert list(worker.wandb_records(data[:-2])) == records[:2]  # the last record cut short


def test_kill_tree_reaches_a_helper_in_its_own_session() -> None:
    # like W&B's service: a grandchild started with start_new_session=True
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            "time.sleep(60)'], start_new_session=True); print(p.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    helper = int(proc.stdout.readline())
    assert helper in peers.process_tree(proc.pid)
    peers.kill_tree(proc.pid)
    assert proc.wait(timeout=10) == -9
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # gone, or a zombie waiting for init to reap it
        try:
            state = Path(f"/proc/{helper}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"helper {helper} still running after kill_tree")


def timed(us: float, read: float) -> dict[str, float]:
    return {"us_per_point": us, "cpu_s": 1.0, "close_s": 1.0, "queryable_s": 1.0, "disk_mb": 1.0, "read_s": read}


def test_the_table_ratios_kills_and_failed_rows() -> None:
    kill = {"points": 90, "points_logged": 100, "kill_after_s": 1.0}
    outcomes = [
        peers.Outcome("tracker", [timed(1.0, 0.01), timed(3.0, 0.03)], kills=[kill]),  # medians 2.0, 0.02
        peers.Outcome("mlflow", [timed(50.0, 1.0)], notes=["kill round 1 (+1 s): exit 1: boom"]),
        peers.Outcome("wandb", [timed(5.0, 1.0)], failed="timed round 1: loss/k0 step 3: logged 0.5, read 0.25"),
        peers.Outcome("aim", error="pip install aim==3.29.1 failed"),
    ]
    lines = peers.table(outcomes, keys=1, steps=10, rounds=2, kill_after=[1.0]).splitlines()
    assert lines[0].startswith("10 points (1 keys x 10 steps), median of 2 round(s)")
    assert "kill -9 +1s kept" in lines[1]
    ours, mlflow = lines[2].split(), lines[3].split()
    assert ours[0] == "tracker" and ours[-3:] == ["90.00%", "1.0", "1.0"]
    assert mlflow[-3:] == ["-", "25.0", "50.0"]  # its kill round failed: no figure
    assert lines[4].split()[:2] == ["wandb", "FAILED"] and "logged 0.5, read 0.25" in lines[4]
    assert "not measured: pip install aim==3.29.1 failed" in lines[5]
    assert "  mlflow not measured in kill round 1 (+1 s): exit 1: boom" in lines
    assert any(ln.startswith("  mlflow: MLflow 3.17.2 log_batch(synchronous=False)") for ln in lines)


def test_a_share_reads_100_percent_only_when_nothing_was_lost() -> None:
    assert peers._kept(1.0) == "100%"
    assert peers._kept(99_974 / 100_000) == "99.97%"
    assert peers._kept(999_999 / 1_000_000) == "99.99%"  # not rounded up to 100
    assert peers._kept(None) == "-"


def test_unknown_peer_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        peers.main(["--peers", "tracker,comet"])
    assert "unknown peer(s) comet" in capsys.readouterr().err
