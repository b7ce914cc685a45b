"""Smoke test of bench/codec.py's record API (a tiny run; the benchmark itself is not a test)."""

from __future__ import annotations

import json

from bench import codec


def test_run_codec_benchmark_returns_records() -> None:
    records = codec.run_codec_benchmark(
        body_sizes=(16,), shapes=("p2p",), repeats=1, batch_seconds=0.001, pool_frames=4
    )
    measured = [r for r in records if r["library"] != "summary"]
    assert {(r["library"], r["operation"]) for r in measured} == {
        (lib, op) for lib in codec.LIBRARIES for op in ("encode", "decode")
    }
    for r in measured:
        assert r["benchmark"] == "codec" and r["body_bytes"] == 16
        assert r["ops_per_second"] > 0 and r["frame_bytes"] > 16
    (summary,) = [r for r in records if r["library"] == "summary"]
    assert {"encode_ratio", "decode_ratio", "meets_target", "target"} <= set(summary)
    json.dumps(records)  # plain data, ready for the records files


def test_main_prints_a_table_and_a_json_line(capsys: object) -> None:
    assert codec.main(["--quick", "--sizes", "16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()  # type: ignore[attr-defined]
    final = json.loads(out[-1])
    assert final["benchmark"] == "codec" and set(final["results"]) == set(codec.LIBRARIES)
    assert set(final["ratios"]) == set(final["meets_target_by_case"]) == {"p2p_16", "basic_16"}
    assert all(set(r) == {"encode", "decode"} for r in final["ratios"].values())
