#!/usr/bin/env bash
# Valgrind's memcheck over npumem-core's tests, built in release with debug info: a read or
# write outside an allocation, a branch on uninitialised bytes or a bad free fails the run. The
# unit tests run but for the two that reserve hundreds of GiB of address space (valgrind cannot
# map that much; they check what a reservation commits, not memory safety), then the
# integration tests of the pool, handle generations, moves and their faults, migration,
# compaction and the slab races. Valgrind runs one thread at a time; its fair scheduler keeps
# threads that wait for each other from starving (without it the compaction load test runs for
# many minutes). About six minutes on two cores. `PY` names the Python that runs
# scripts/test_executables.py (python3 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-python3}
integration=(pool generations mover_faults slab_races migration compaction)

args=(--lib)
for t in "${integration[@]}"; do
    args+=(--test "$t")
done
executables=$(cargo test -p npumem-core --release "${args[@]}" --no-run --message-format=json-render-diagnostics \
    | "$py" scripts/test_executables.py)

# The executable of a test target: cargo names it after the target, then a hash.
executable() {
    local found
    found=$(grep -E "/$1-[0-9a-f]+\$" <<<"$executables" || true)
    if [ -z "$found" ] || [ "$(wc -l <<<"$found")" -ne 1 ]; then
        echo "memcheck: no single test executable for $1" >&2
        exit 1
    fi
    echo "$found"
}

# Run test target $1 (its label $2) under memcheck, with the test harness's arguments after.
run() {
    local bin
    bin=$(executable "$1")
    echo "memcheck: $2" >&2
    shift 2
    (cd rust/core && valgrind --tool=memcheck --fair-sched=yes --error-exitcode=99 --leak-check=no -q \
        "$bin" --test-threads=2 "$@")
}

run npumem_core "unit tests" \
    --skip a_small_pool_that_may_grow_to_a_tebibyte --skip an_empty_huge_pool_commits
for t in "${integration[@]}"; do
    run "$t" "tests/$t.rs"
done
echo "memcheck: no errors" >&2
