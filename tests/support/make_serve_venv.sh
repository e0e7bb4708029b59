#!/usr/bin/env bash
# Build the "serve" venv that the end-to-end tests use:
#   * SGLang's own argument parser (sglang, CPU torch, the light deps its parser imports),
#   * the real sglang-router (its parser, and the router binary itself),
#   * the real smg, sglang-router's successor (router.package: smg), in the same venv: its deps
#     (grpcio, grpcio-health-checking, pyyaml, setproctitle) agree with sglang-router's and
#     `pip check` is clean. Both ship a `smg` console script (sglang-router 0.3.2's
#     entry_points.txt names `smg=sglang_router.cli:main`); smg is installed second so
#     bin/smg is smg's own. pdsvc never runs that script: it renders `python -m MODULE`.
#   * supervisor (a real supervisord for the supervisord renderer's tests),
#   * NIXL (`pdsvc doctor --kv`'s transfers): the `nixl` meta wheel and one backend wheel,
#     --no-deps: nixl-cu13 asks for torch (a CUDA build) and numpy, and both are here already;
#     with no CUDA on the machine the meta package loads whichever backend is installed.
#
# Usage: tests/support/make_serve_venv.sh [DIR]     (default: .venv-serve in the repo root)
#        PDSVC_SERVE_PYTHON=/usr/bin/python3.11 ...  (another interpreter under /usr)
#
# Why Debian's /usr/bin/python3 and not whatever python3 is on PATH: the venv is later
# bind-mounted into a systemd-nspawn container that only has the host's /usr, so its
# bin/python must point into /usr. (A venv's console scripts carry absolute shebangs, so
# mount it at the same path inside the container.)
#
# Idempotent: a stamp file inside DIR records a hash of the recipe below; when it matches,
# nothing is done. Any other DIR content that looks like a venv is rebuilt from scratch.
#
# Why torch is pinned to the CPU build through a constraint file of our own: an unpinned
# torch (asked for directly or by any dependency) resolves to a CUDA build plus ~5 GB of
# NVIDIA wheels. The CPU wheel lies in /opt/wheels (pip's find-links on these machines).
#
# Why no triton: sglang imports it once, at module level, for nothing the parser needs;
# tests/support/argv_check.py installs a stub module instead (saves ~1 GB). Every `sglang.*`
# import runs sglang/__init__.py, which imports sglang.srt.utils.common and with it triton, so
# sglang.bench_serving has no lighter import path: the tests run it with
# tests/support/bench_site/ on PYTHONPATH, whose sitecustomize.py installs the same stub.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/../.." && pwd)"
venv_dir="${1:-$repo_root/.venv-serve}"
python="${PDSVC_SERVE_PYTHON:-/usr/bin/python3}"

torch_pin="torch==2.13.0+cpu"
sglang_pin="sglang==0.5.23"
router_pin="sglang-router==0.3.2"
smg_pin="smg==1.13.0"
supervisor_pin="supervisor==4.3.0"
nixl_pins=("nixl==1.5.1" "nixl-cu13==1.5.1")
# What SGLang 0.5.23's parser imports (found one missing module at a time).
light_deps=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec
            pydantic pyzmq tqdm IPython aiohttp huggingface_hub
            click jinja2 pyyaml)  # + what pdsvc itself needs, to run `pdsvc status` inside
# Import names of everything above, checked at the end (sglang itself needs the triton stub:
# argv_check.py checks it).
import_check="numpy orjson psutil pybase64 requests packaging PIL starlette msgspec pydantic
pydantic_core zmq tqdm IPython aiohttp huggingface_hub torch sglang_router smg supervisor click
jinja2 yaml nixl._api"
system_constraints=/etc/xdg/pip/constraints.txt

log() { printf '[make_serve_venv] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

[[ -x "$python" ]] || die "$python not found (Debian's python3; apt-get install python3 python3-venv)"
case "$(readlink -f "$python")" in
    /usr/*) ;;
    *) die "$python resolves outside /usr; the venv must use Debian's python (see header)" ;;
esac
py_version="$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"

recipe="python=$py_version
$torch_pin
$sglang_pin --no-deps
$router_pin
$smg_pin
$supervisor_pin
${nixl_pins[*]} --no-deps
${light_deps[*]}
no-triton
recipe-version=2"
recipe_hash="$(printf '%s\n' "$recipe" | sha256sum | cut -d' ' -f1)"
stamp="$venv_dir/.pdsvc-serve-venv.stamp"

# The bench layer (`pdsvc bench` runs SGLang's own sglang.bench_serving in this venv): what
# sglang/benchmark/serving.py imports beyond the parser's deps, at the versions sglang 0.5.23's
# own metadata pins (transformers==5.19.0, tokenizers==0.23.2; tokenizers asks for
# huggingface-hub<2.0), and `datasets`, which sglang requires unpinned and
# sglang/benchmark/datasets/mmmu.py imports at module level. (Not torchvision: PyPI's wheel
# is built for CUDA torch and fails to load against the CPU build; see bench_site/.) It is a
# layer of its own, with its own stamp, added to an existing venv in place: a change here reinstalls these packages only, never wipes the venv.
bench_pins=("transformers==5.19.0" "tokenizers==0.23.2" "huggingface_hub<2.0" "datasets==5.2.0")
bench_recipe="${bench_pins[*]}
bench-recipe-version=1"
bench_hash="$(printf '%s\n' "$bench_recipe" | sha256sum | cut -d' ' -f1)"
bench_stamp="$venv_dir/.pdsvc-serve-venv.bench.stamp"

bench_layer() {
    if [[ -f "$bench_stamp" && "$(cat "$bench_stamp")" == "$bench_hash" ]]; then
        log "bench layer is up to date (recipe $bench_hash)"
        return 0
    fi
    local t pip_cmd=("$venv_dir/bin/python" -m pip --disable-pip-version-check --no-input)
    local cargs=(-c "$venv_dir/pdsvc-constraints.txt")
    [[ -f "$system_constraints" ]] && cargs+=(-c "$system_constraints")
    t="$(now)"
    "${pip_cmd[@]}" install "${cargs[@]}" "${bench_pins[@]}"
    # bench_serving's own parser (and its imports) through argv_check's triton stub
    "$venv_dir/bin/python" "$here/argv_check.py" bench -- --backend sglang \
        --dataset-name random-ids --num-prompts 1 >/dev/null
    printf '%s\n' "$bench_hash" >"$bench_stamp"
    log "bench layer (${bench_pins[*]}) installed and checked in $(elapsed "$t") s"
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$recipe_hash" ]]; then
    log "$venv_dir is up to date (recipe $recipe_hash)"
    bench_layer
    exit 0
fi

if [[ -e "$venv_dir" ]]; then
    # Only ever wipe something that is a venv (or an empty directory): DIR is user input.
    if [[ -f "$venv_dir/pyvenv.cfg" ]] || [[ -d "$venv_dir" && -z "$(ls -A "$venv_dir")" ]]; then
        log "rebuilding $venv_dir (stamp missing or recipe changed)"
        rm -rf -- "$venv_dir"
    else
        die "$venv_dir exists and is not a venv; refusing to touch it"
    fi
fi

t_all="$(now)"
t="$(now)"
"$python" -m venv "$venv_dir" \
    || die "'$python -m venv' failed: on Debian install python3-venv (apt-get install python3-venv)"
log "venv created with $python ($py_version) in $(elapsed "$t") s"

# Our constraint file: torch stays the CPU 2.13.0 build whatever asks for torch.
constraints="$venv_dir/pdsvc-constraints.txt"
printf '%s\n' "$torch_pin" >"$constraints"
constraint_args=(-c "$constraints")
# -c on the command line replaces pip.conf's `constraint`, so pass the machine's own too.
[[ -f "$system_constraints" ]] && constraint_args+=(-c "$system_constraints")

pip=("$venv_dir/bin/python" -m pip --disable-pip-version-check --no-input)

t="$(now)"
if ! "${pip[@]}" install --only-binary=torch "${constraint_args[@]}" "$torch_pin"; then
    die "could not install $torch_pin: the CPU wheel is expected in pip's find-links
(/opt/wheels here). Elsewhere point pip at a CPU build, e.g.
PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu"
fi
log "torch installed in $(elapsed "$t") s"

t="$(now)"
"${pip[@]}" install "${constraint_args[@]}" "$router_pin" "$supervisor_pin" "${light_deps[@]}"
log "sglang-router, supervisor and light deps installed in $(elapsed "$t") s"

t="$(now)"
"${pip[@]}" install "${constraint_args[@]}" "$smg_pin"
log "smg installed in $(elapsed "$t") s"

t="$(now)"
"${pip[@]}" install "${constraint_args[@]}" --no-deps "$sglang_pin"
log "sglang (--no-deps) installed in $(elapsed "$t") s"

t="$(now)"
"${pip[@]}" install "${constraint_args[@]}" --no-deps "${nixl_pins[@]}"
log "nixl (--no-deps) installed in $(elapsed "$t") s"

t="$(now)"
"$venv_dir/bin/python" - "$import_check" <<'EOF'
import importlib
import sys

missing = []
for name in sys.argv[1].split():
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - report every failure, not just ImportError
        missing.append(f"{name}: {exc!r}")
import torch

if torch.version.cuda is not None:
    missing.append(f"torch is a CUDA build ({torch.__version__})")
if importlib.util.find_spec("triton") is not None:
    missing.append("triton is installed (argv_check.py stubs it; it should not be)")
if missing:
    sys.exit("import check failed:\n  " + "\n  ".join(missing))
EOF
# The real check: both parsers load and accept a minimal command line.
"$venv_dir/bin/python" "$here/argv_check.py" sglang -- --model-path /nonexistent >/dev/null
"$venv_dir/bin/python" "$here/argv_check.py" router -- --pd-disaggregation \
    --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001 >/dev/null
"$venv_dir/bin/python" "$here/argv_check.py" smg -- --pd-disaggregation \
    --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001 >/dev/null
log "imports and the three parsers checked in $(elapsed "$t") s"

printf '%s\n' "$recipe_hash" >"$stamp"
bench_layer
log "done in $(elapsed "$t_all") s: $venv_dir ($(du -sh "$venv_dir" | cut -f1))"
