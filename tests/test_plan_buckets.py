"""Shape buckets: one arena per bucket, the weights shared, every plan valid for its lifetimes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from npumem import plan
from npumem.cli import main
from npumem.plan import Problem
from npumem.plan.networks import NETWORKS

onnx = pytest.importorskip("onnx")

from test_plan_onnx import small_model  # noqa: E402
from test_plan_solution import c_compiler  # noqa: E402


def test_buckets_of_an_onnx_model_share_the_weights() -> None:
    buckets = plan.plan_buckets(
        small_model(), dims={"batch": [1, 4, 16]}, include_weights=True, time_limit=2.0
    )
    assert [b.label for b in buckets.buckets] == ["batch=1", "batch=4", "batch=16"]
    # w1 (16x16) and w2 (16x8) float32 and the two reshape targets, laid out once.
    assert buckets.weights is not None
    assert set(buckets.weights.offsets) == {"w1", "w2", "shape2", "shape3"}
    buckets.weights.validate()
    assert 16 * 16 * 4 + 16 * 8 * 4 + 40 <= buckets.weights_size < 16 * 16 * 4 + 16 * 8 * 4 + 200
    for bucket in buckets.buckets:
        bucket.solution.validate()
        alone = Problem.from_onnx(small_model(), dims=bucket.dims)
        assert len(bucket.solution.problem) == len(alone)
        assert bucket.solution.arena_size == plan.solve(alone, time_limit=2.0).arena_size
        table = buckets.tensor_offsets(bucket)
        # Weights first, each bucket's activations after them.
        weights = set(buckets.weights.offsets)
        assert all(table[w][0] + table[w][1] <= buckets.weights_size for w in weights)
        assert min(off for name, (off, _) in table.items() if name not in weights) >= (
            buckets.weights_size
        )
    assert buckets.largest.label == "batch=16"
    assert buckets.arena_size == buckets.weights_size + buckets.largest.solution.arena_size
    assert buckets.lower_bound <= buckets.arena_size


def test_buckets_of_a_bundled_network_and_several_dimensions() -> None:
    buckets = plan.plan_buckets(
        NETWORKS["bert_base"], dims={"batch": [1, 2], "seq_len": [64, 128]}, time_limit=1.0
    )
    assert len(buckets.buckets) == 4
    assert buckets.weights is None and buckets.weights_size == 0
    assert buckets.largest.dims == {"batch": 2, "seq_len": 128}
    for bucket in buckets.buckets:
        bucket.solution.validate()
    assert plan.bucket_dims({"a": 1, "b": [2, 3]}) == [{"a": 1, "b": 2}, {"a": 1, "b": 3}]
    with pytest.raises(plan.PlanError, match="no value"):
        plan.bucket_dims({"a": []})


def test_buckets_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), str(model))
    out = tmp_path / "plan.h"
    code = main(
        [
            "plan",
            str(model),
            "-o",
            str(out),
            "--dim",
            "batch=1,8,32",
            "--include-weights",
            "--double-buffer",
            "x",
            "--time-limit",
            "1",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "3 buckets" in text and "bytes, shared" in text
    assert "largest" in text and "batch=32" in text
    for value in (1, 8, 32):
        header = (tmp_path / f"plan.batch{value}.h").read_text()
        assert "x#slot1" in header
    csv_input = Path(__file__).resolve().parent / "data" / "minimalloc" / "input.12.csv"
    assert main(["plan", str(csv_input), "--dim", "batch=1,2"]) == 2
    assert "ONNX" in capsys.readouterr().err


def test_buckets_meet_the_capacity_or_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), str(model))
    out = tmp_path / "plan.json"
    args = ["plan", str(model), "-o", str(out), "--dim", "batch=1,8", "--time-limit", "0.5"]
    assert main([*args, "--capacity", "1GiB"]) == 0
    files = [tmp_path / "plan.batch1.json", tmp_path / "plan.batch8.json"]
    assert all(f.exists() for f in files)
    assert f"written      {files[0]}, {files[1]}" in capsys.readouterr().out
    for f in files:
        f.unlink()
    assert main([*args, "--capacity", "64"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("npumem plan: capacity 64 not met: the largest bucket needs")
    assert "\n" not in err and "batch=8" in err
    assert not any(f.exists() for f in files), "nothing is written when a bucket is over"
    assert main([*args, "--pool", "sram=1MiB", "--pool", "hbm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("npumem plan: error: --pool plans one model") and "\n" not in err
    assert not any(f.exists() for f in files)


def test_each_bucket_file_holds_the_weights_and_the_activations_after_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --include-weights, each bucket's file is the whole memory of that bucket, as the
    file of a single bucket is: the weights at their shared offsets, the activations after
    them, the arena size covering both."""
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), str(model))
    args = ["--dim", "batch=1,8", "--include-weights", "--time-limit", "1"]
    assert main(["plan", str(model), "-o", str(tmp_path / "plan.json"), *args]) == 0
    printed = capsys.readouterr().out
    assert main(["plan", str(model), "-o", str(tmp_path / "plan.h"), *args, "-q"]) == 0
    plans = {v: json.loads((tmp_path / f"plan.batch{v}.json").read_text()) for v in (1, 8)}
    weights = {"w1", "w2", "shape2", "shape3"}
    shared = None
    for value, obj in plans.items():
        tensors = {t["name"]: (t["offset"], t["size"]) for t in obj["tensors"]}
        # The same tensors as the plan of that one bucket with its weights.
        single = tmp_path / f"single{value}.json"
        assert main(["plan", str(model), "-o", str(single), "--dim", f"batch={value}",
                     "--include-weights", "-q"]) == 0  # fmt: skip
        assert set(tensors) == {t["name"] for t in json.loads(single.read_text())["tensors"]}
        assert weights <= set(tensors)
        placed = {name: tensors[name][0] for name in weights}
        shared = shared or placed
        assert placed == shared, "the weights lie at the same offsets in every bucket"
        top = max(off + size for name, (off, size) in tensors.items() if name in weights)
        activations = [off for name, (off, _) in tensors.items() if name not in weights]
        assert min(activations) >= top
        assert all(off % 64 == 0 for off, _ in tensors.values())
        assert obj["arena_size"] == max(off + size for off, size in tensors.values())
        assert obj["lower_bound"] <= obj["arena_size"]
        # Read back, the file is a valid plan with every buffer pinned where it is.
        problem = Problem.from_json(tmp_path / f"plan.batch{value}.json")
        assert all(b.offset is not None for b in problem.buffers)
        assert plan.solve(problem, time_limit=1.0).arena_size == obj["arena_size"]
        header = (tmp_path / f"plan.batch{value}.h").read_text()
        assert f"#define PLAN_BATCH{value}_ARENA_SIZE {obj['arena_size']}u" in header
        for name, (off, size) in tensors.items():
            assert f'{{"{name}", {off}u, {size}u}},' in header
    assert f"largest      {plans[8]['arena_size']:,} bytes" in printed
    assert f"{plans[8]['arena_size']:>16,}" in printed.splitlines()[-3]


def test_bucket_headers_go_into_one_program(tmp_path: Path) -> None:
    """Each bucket's C header names its table and macros after its own file, so a program
    that serves every bucket includes them all and reads each one's arena."""
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), str(model))
    args = ["--dim", "batch=1,8", "--time-limit", "1", "-q"]
    assert main(["plan", str(model), "-o", str(tmp_path / "plan.h"), *args]) == 0
    assert main(["plan", str(model), "-o", str(tmp_path / "plan.json"), *args]) == 0
    sizes = {v: json.loads((tmp_path / f"plan.batch{v}.json").read_text()) for v in (1, 8)}
    for value in (1, 8):
        header = (tmp_path / f"plan.batch{value}.h").read_text()
        assert f"#ifndef PLAN_BATCH{value}_H" in header
        assert f"plan_batch{value}_table[PLAN_BATCH{value}_NUM_TENSORS]" in header
    cc = c_compiler()
    if cc is None:
        return  # the text checks above are all this machine can do
    program = tmp_path / "both.c"
    program.write_text(
        '#include <stdio.h>\n#include "plan.batch1.h"\n#include "plan.batch8.h"\n'
        "int main(void) {\n"
        '    printf("%u %u %s %s\\n", PLAN_BATCH1_ARENA_SIZE, PLAN_BATCH8_ARENA_SIZE,\n'
        "           plan_batch1_table[0].name, plan_batch8_table[0].name);\n"
        "    return 0;\n}\n"
    )
    exe = tmp_path / "both"
    command = [cc, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", str(program)]
    subprocess.run([*command, "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert out[:2] == [str(sizes[1]["arena_size"]), str(sizes[8]["arena_size"])]
    assert out[2] == sizes[1]["tensors"][0]["name"] and out[3] == sizes[8]["tensors"][0]["name"]


def test_the_activations_after_the_weights_stay_aligned() -> None:
    """Weights whose sizes are not multiples of the alignment (shape constants of 16 and 24
    bytes) end between two aligned offsets: the activations start at the next one."""
    buckets = plan.plan_buckets(
        small_model(), dims={"batch": [1, 4]}, include_weights=True, time_limit=1.0
    )
    assert buckets.weights is not None and buckets.weights.arena_size % 64
    assert buckets.weights_size % 64 == 0
    assert buckets.weights.arena_size <= buckets.weights_size < buckets.weights.arena_size + 64
    for bucket in buckets.buckets:
        whole = buckets.solution_of(bucket)
        whole.validate()
        assert whole.arena_size == buckets.weights_size + bucket.solution.arena_size
        assert whole.tensor_offsets() == buckets.tensor_offsets(bucket)
        for name, (off, _) in buckets.tensor_offsets(bucket).items():
            if name not in buckets.weights.offsets:
                assert off % 64 == 0, name
