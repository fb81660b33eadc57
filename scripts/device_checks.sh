#!/usr/bin/env bash
# The checks that need the device machine (16 CPU cores and a CUDA GPU), as one short run:
#
#   1. the churn's thread scaling (`mixed_sizes --only threads`) at 2, 4, 8 and 16 threads,
#      npumem alone at 2-8 and beside its peers at 16;
#   2. npumem as PyTorch's CUDA allocator (`scripts/gpu_check_torch.py`).
#
# That machine has no Rust toolchain: `make device-bundle` builds here what the run needs
# (.device/mixed_sizes, and the extension and libnpumem.so in python/npumem/), and the device
# tool's run carries them:
#
#   run(command="bash scripts/device_checks.sh", timeout_s=540,
#       carry=[".device", "python/npumem/_core.abi3.so", "python/npumem/libnpumem.so"])
#
# Writes threads.md, torch.json and torch.log to $OUT (./device-out where OUT is unset); runs
# every step, then exits 1 if one failed (2 if the bundle is missing).
set -u
out=${OUT:-device-out}
bin=.device/mixed_sizes
if [[ ! -x $bin ]]; then
    echo "device_checks: $bin is missing: run 'make device-bundle' here first" >&2
    exit 2
fi
mkdir -p "$out"
status=0
echo "CPUs: $(nproc)" >"$out/threads.md"
for threads in 2 4 8 16; do
    peers=(--peer npumem)
    [[ $threads == 16 ]] && peers=()
    if ! timeout 150 "$bin" --only threads --threads "$threads" --runs 3 --steps 400000 "${peers[@]}" \
        >>"$out/threads.md" 2>&1; then
        echo "device_checks: the threads table at $threads threads failed" | tee -a "$out/threads.md" >&2
        status=1
    fi
done
if ! PYTHONPATH=python timeout 180 python3 scripts/gpu_check_torch.py --out "$out/torch.json" \
    >"$out/torch.log" 2>&1; then
    echo "device_checks: the PyTorch check failed (torch.log)" >&2
    status=1
fi
cat "$out/threads.md" "$out/torch.log"
exit $status
