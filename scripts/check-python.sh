#!/usr/bin/env bash
# The Python package as a user gets it: `pip install ./python` (maturin from
# PyPI builds the Rust extension) into a fresh virtual environment, then its
# pytest suite. Exits non-zero when the build or a test fails; pytest's
# summary line is the last line it prints.
#
# CARGO_TARGET_DIR, when unset, is target/python, so the release build stays
# out of python/ and is reused by the next run. AUTOPAR_BIN, when set to an
# autopar binary, adds a byte-for-byte comparison with its plan files.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/python}"

venv="$(mktemp -d "${TMPDIR:-/tmp}/autopar-py-venv.XXXXXX")"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
echo "== pip install ./python pytest (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check ./python pytest
echo "== pytest python/tests"
# python/tests has no __init__.py: pytest puts that folder, not python/, on
# sys.path, so `import autopar` is the installed package.
"$venv/bin/python" -m pytest python/tests -q -rs -p no:cacheprovider
