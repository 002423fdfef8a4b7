#!/bin/sh
# Cross-compile every csrc/*.c file for Windows with MinGW (a compile check), then build
# tests/windows/pio_check.c against the I/O and buffer kernels and run it under Wine.
# Needs Debian's gcc-mingw-w64-x86-64 (and wine64 for the run); not part of .ci/run.
set -eu
cd "$(dirname "$0")/../.."
CC=${CC:-x86_64-w64-mingw32-gcc}
out=$(mktemp -d)
trap 'rm -rf "$out" 2>/dev/null || true' EXIT
for src in csrc/*.c; do
    "$CC" -O2 -std=c99 -Wall -Wextra -Werror -Icsrc -c "$src" -o "$out/$(basename "$src" .c).o"
done
echo "compiled for Windows: $(ls csrc/*.c | wc -l) files"
"$CC" -O2 -std=c99 -Wall -Wextra -Icsrc tests/windows/pio_check.c "$out/pio.o" "$out/buffers.o" \
    "$out/fallbacks.o" "$out/crc32.o" "$out/uring.o" -o "$out/pio_check.exe"
WINE=$(command -v wine64 || command -v wine || { test -x /usr/lib/wine/wine64 && echo /usr/lib/wine/wine64; } || true)
if [ -n "$WINE" ]; then
    cd "$out"
    status=0
    WINEDEBUG=-all WINEPREFIX="$out/prefix" "$WINE" ./pio_check.exe || status=$?
    # Let Wine's server finish writing its prefix before the trap removes it.
    WINEPREFIX="$out/prefix" "$(dirname "$WINE")/wineserver" -w 2>/dev/null || true
    exit "$status"
else
    echo "no wine: built $out/pio_check.exe, not run"
fi
