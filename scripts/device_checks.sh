#!/usr/bin/env bash
# The checks that need the device machine (16 CPU cores and a CUDA GPU), as one short run:
#
#   1. the churn at 50% and 85% beside the peers, on a quiet core (`mixed_sizes --only churn`);
#   2. the churn's thread scaling (`mixed_sizes --only threads`) at 2, 4, 8 and 16 threads,
#      beside the peers at 2 and 16, npumem alone at 4 and 8;
#   3. the Python round trip over random sizes (`benches/python_roundtrip.py --only random`),
#      five runs;
#   4. npumem as PyTorch's CUDA allocator (`scripts/gpu_check_torch.py`);
#   5. every Rust test of npumem-core on 16 cores, twice, then the stress test at the scale of
#      `make stress` (32 threads x 3.4M operations).
#
# That machine has no Rust toolchain: `make device-bundle` builds here what the run needs
# (.device/mixed_sizes, the stripped test executables in .device/tests, and the extension and
# libnpumem.so in python/npumem/), and the device tool's run carries them:
#
#   run(command="bash scripts/device_checks.sh", timeout_s=480,
#       carry=[".device", "python/npumem/_core.abi3.so", "python/npumem/libnpumem.so"])
#
# Writes churn.md, threads.md, python.md, torch.json, torch.log and tests.log to $OUT
# (./device-out where OUT is unset); runs every step, then exits 1 if one failed (2 if the
# bundle is missing).
set -u
out=${OUT:-device-out}
bin=.device/mixed_sizes
if [[ ! -x $bin ]] || ! compgen -G ".device/tests/*" >/dev/null; then
    echo "device_checks: the bundle in .device is missing: run 'make device-bundle' here first" >&2
    exit 2
fi
mkdir -p "$out"
status=0
fail() {
    echo "device_checks: $1" | tee -a "$out/failures.txt" >&2
    status=1
}
machine="CPUs: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

echo "$machine" >"$out/churn.md"
# CPU 2: away from the threads that the kernel and this script's own shell favour.
timeout 120 taskset -c 2 "$bin" --only churn --runs 5 >>"$out/churn.md" 2>&1 || fail "the churn table failed"

echo "$machine" >"$out/threads.md"
for threads in 2 4 8 16; do
    args=(--runs 5 --steps 1000000 --peer npumem)
    [[ $threads == 2 ]] && args=(--runs 5 --steps 1000000)
    [[ $threads == 16 ]] && args=(--runs 3 --steps 400000)
    timeout 150 "$bin" --only threads --threads "$threads" "${args[@]}" >>"$out/threads.md" 2>&1 \
        || fail "the threads table at $threads threads failed"
done

echo "$machine, $(python3 --version)" >"$out/python.md"
for run in 1 2 3 4 5; do
    PYTHONPATH=python timeout 60 python3 benches/python_roundtrip.py --only random --repeat 15 \
        >>"$out/python.md" 2>&1 || fail "the Python round trip failed (run $run)"
done

PYTHONPATH=python timeout 180 python3 scripts/gpu_check_torch.py --out "$out/torch.json" \
    >"$out/torch.log" 2>&1 || fail "the PyTorch check failed (torch.log)"

echo "$machine" >"$out/tests.log"
for round in 1 2; do
    # The second round only where the first left time for the full-scale stress test.
    if [[ $round == 2 && $SECONDS -gt 240 ]]; then
        echo "== round 2 skipped: $SECONDS s gone" >>"$out/tests.log"
        break
    fi
    for test in .device/tests/*; do
        echo "== round $round: $test" >>"$out/tests.log"
        # Integration tests run from the crate's folder, as cargo runs them.
        (cd rust/core && timeout 150 "../../$test" --test-threads=16 -q) >>"$out/tests.log" 2>&1 \
            || fail "$test failed in round $round (tests.log)"
    done
done
stress=$(ls .device/tests/stress-*)
echo "== stress at the scale of make stress: 32 threads x 3,400,000 operations" >>"$out/tests.log"
(cd rust/core && NPUMEM_STRESS_THREADS=32 NPUMEM_STRESS_ITERS=3400000 NPUMEM_STRESS_MAX_SIZE=8192 \
    NPUMEM_STRESS_SLOTS=64 NPUMEM_STRESS_CAPACITY_MIB=256 \
    timeout 150 "../../$stress" stress_mixed_sizes --nocapture) >>"$out/tests.log" 2>&1 \
    || fail "the stress test at full scale failed (tests.log)"

cat "$out/churn.md" "$out/threads.md" "$out/python.md" "$out/torch.log"
grep -E "^test result|^== stress|allocations|FAILED|panicked" "$out/tests.log"
exit $status
