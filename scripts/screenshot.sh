#!/bin/sh
# Renders a stallscope HTML report to a PNG with headless Chromium, to look at the report the
# way a reader will. Offline: the report is self-contained and Chromium's background network
# features are off.
#
#   scripts/screenshot.sh REPORT.html OUT.png [WIDTHxHEIGHT]
#   scripts/screenshot.sh TRACE OUT.png [WIDTHxHEIGHT]   # runs `stallscope analyze TRACE --html`
#
# STALLSCOPE names the binary to run for a trace (default: stallscope on PATH); extra
# analyze flags can be given in STALLSCOPE_ARGS (e.g. "--threshold 5ms --threads t.txt").
# Needs Debian's chromium (`apt-get install -y chromium`).
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 REPORT.html|TRACE OUT.png [WIDTHxHEIGHT]" >&2
    exit 2
fi
input=$1
out=$2
size=${3:-1400x1000}
width=${size%x*}
height=${size#*x}

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    echo "$0: error: chromium not found: apt-get install -y chromium" >&2
    exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

case "$input" in
*.html | *.htm)
    html=$input
    ;;
*)
    html=$work/report.html
    # Exit code 1 means "stalls found", which is what we want to look at.
    set +e
    # shellcheck disable=SC2086
    ${STALLSCOPE:-stallscope} analyze ${STALLSCOPE_ARGS:-} --html "$html" "$input" >/dev/null
    rc=$?
    set -e
    if [ "$rc" -gt 1 ] || [ ! -s "$html" ]; then
        echo "$0: error: stallscope analyze failed on $input (exit $rc)" >&2
        exit 2
    fi
    ;;
esac

abs=$(cd "$(dirname "$html")" && pwd)/$(basename "$html")
case "$out" in
/*) out_abs=$out ;;
*) out_abs=$(pwd)/$out ;;
esac

"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$work/profile" \
    --screenshot="$out_abs" --window-size="$width,$height" "file://$abs" >"$work/chromium.log" 2>&1 || {
    cat "$work/chromium.log" >&2
    exit 2
}
if [ ! -s "$out_abs" ]; then
    cat "$work/chromium.log" >&2
    echo "$0: error: no screenshot written" >&2
    exit 2
fi
echo "$out_abs"
