#!/usr/bin/env bash
# Prepares, on a machine with PyPI access, the wheels that an offline GPU host needs to run
# `easyr1 bench` with vLLM and the TRL peer (bench/README.md). The host is taken to have Python
# 3.12 on x86-64 Linux with torch 2.11.0+cu130, transformers 5.17, accelerate, pandas, pyarrow,
# pillow and jinja2 already installed; this brings what it lacks, pinned and without
# dependency resolution (pip resolving for another machine would pull a second torch):
#   - vLLM 0.24.0, the release built for torch 2.11 (torchvision 0.26, torchaudio 2.11), and the
#     packages it needs beyond those. openai stays at 2.x (3.x needs a package missing here) and
#     xgrammar at 0.2.1 (newer ones do not load with apache-tvm-ffi 0.1.9).
#   - the engine's own: datasets 5.2.0 with dill, multiprocess and fsspec; math-verify 0.9.0 with
#     its LaTeX parser (the anchor's reward). The host's transformers 5.17 stays: with 5.24,
#     vLLM 0.24's Qwen-VL memory profiling failed.
#   - the TRL peer: trl 1.16.0.
#   - the harness: Snakemake 9.27.1 and the packages it needs beyond the host's, so that the hardware
#     workflow (rules/memory.smk) runs there (bash bench/h200.sh hardware). connection_pool has no
#     wheel on PyPI: it is built here from its source (pure Python).
#
# Usage (from anywhere):  bash bench/gpu_wheels.sh [OUT [PART_MIB [GROUPS]]]
#   OUT       wheel folder, default .gpu_wheels at the repository root (ignored by git). The wheels
#             land in OUT/all, made anew each run with the groups asked for.
#   PART_MIB  for a host that takes transfers of at most this size: OUT/part0, OUT/part1, ... each
#             hold at most PART_MIB MiB. A wheel larger than that is cut into equal pieces
#             (NAME.whl.part00, ...) with its checksum (NAME.whl.sha256); the small wheels fill the
#             room beside the pieces. Send the parts one by one into one folder on the host.
#   GROUPS    which of the groups above, comma-separated (default vllm,engine,peer,harness): the
#             memory table's cells need only engine,harness (59 MB: one 60 MiB part; they use the HF rollout).
# On the host: bash bench/h200.sh install [FOLDER]  (FOLDER defaults to .gpu_wheels; it finds the
# wheels and pieces at any depth below it, puts the pieces together and checks them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu_wheels}
part_mib=${2:-}
groups=${3:-vllm,engine,peer,harness}

vllm=(
  vllm==0.24.0 openai==2.54.0 xgrammar==0.2.1 annotated-types==0.8.0 apache-tvm-ffi==0.1.9 blake3==1.0.11
  cachetools==8.0.2 cbor2==6.3.0 compressed-tensors==0.17.0 depyf==0.20.0 diskcache==5.6.3 distro==1.9.0
  fastapi==0.136.3 flashinfer-python==0.6.12 gguf==0.19.0 ijson==3.6.0 interegular==0.3.3 jiter==0.19.0
  lark==1.2.2 llguidance==1.7.6 lm-format-enforcer==0.11.3 mistral_common==1.13.1 msgspec==0.23.0
  openai-harmony==0.0.8 outlines_core==0.2.14 partial-json-parser==0.2.1.1.post7
  prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5
  python-json-logger==4.2.0 pyzmq==27.3.0 setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0
  typing-inspection==0.4.5 watchfiles==1.3.0
  # mistral_common's imports that the host lacks: transformers imports it when it checks a
  # processor's tokenizer, so a video or image prompt fails without them (seen 2026-12-02).
  pydantic-extra-types==2.11.1 pycountry==26.2.16 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  referencing==0.37.0 rpds-py==2026.9.1
)
engine=(
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
  av==18.1.0  # video decoding (the anchor_video workload)
  mathruler==0.1.0 pylatexenc==2.11  # EasyR1's reward files import mathruler.grader
)
peer=(trl==1.16.0)
harness=(
  snakemake==9.27.1 snakemake-interface-common==1.23.0 snakemake-interface-executor-plugins==9.4.0
  snakemake-interface-logger-plugins==2.1.0 snakemake-interface-report-plugins==1.3.0
  snakemake-interface-scheduler-plugins==2.0.2 snakemake-interface-storage-plugins==4.4.1
  argparse-dataclass==2.0.0 conda-inject==1.3.2 configargparse==1.9.0 docutils==0.22.4 dpath==2.2.0
  fastjsonschema==2.22.3 gitdb==4.0.12 gitpython==3.2.1 greenlet==3.5.6 humanfriendly==10.0 immutables==0.21
  jupyter-core==5.9.1 nbformat==5.11.1 platformdirs==4.14.9 pulp==3.3.2 smart-open==7.7.1 smmap==5.0.3
  sqlalchemy==2.0.58 sqlmodel==0.0.37 tenacity==9.2.1 throttler==1.2.3 traitlets==5.16.1 yte==1.9.4
  # sqlmodel's, and the schema validation's: the vLLM group brings them too, but the memory cells
  # go without it (seen 2026-12-02).
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
)

# The host's interpreter and the manylinux levels its glibc accepts.
target=(--only-binary=:all: --python-version 3.12 --implementation cp)
for tag in 2_35 2_34 2_31 2_28 2_27 2_26 2_24 2_17 2_12 2_5; do target+=(--platform "manylinux_${tag}_x86_64"); done
target+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)

wanted=()
for group in ${groups//,/ }; do
  case $group in
    vllm) wanted+=("${vllm[@]}") ;;
    engine) wanted+=("${engine[@]}") ;;
    peer) wanted+=("${peer[@]}") ;;
    harness) wanted+=("${harness[@]}") ;;
    *) echo "unknown group $group: choose among vllm, engine, peer, harness" >&2; exit 2 ;;
  esac
done
mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | sort -u)  # a package of two groups once
rm -rf "$out/all"  # exactly the groups asked for
mkdir -p "$out/all"
python3 -m pip download -q --no-deps "${target[@]}" -d "$out/all" "${wanted[@]}"
if [[ ,$groups, == *,harness,* ]]; then
  python3 -m pip wheel -q --no-deps -w "$out/all" connection_pool==0.0.3
fi
echo "$(find "$out/all" -name '*.whl' | wc -l) wheels, $(du -sh "$out/all" | cut -f1), in $out/all"
[ -n "$part_mib" ] || exit 0

limit=$((part_mib * 1024 * 1024))
rm -rf "$out"/part[0-9]*
pieces=$(mktemp -d)
trap 'rm -rf "$pieces"' EXIT
# Wheels too large for a part: equal pieces (the fewest that fit) and a checksum to verify them by.
for wheel in "$out"/all/*.whl; do
  size=$(stat -c %s "$wheel")
  [ "$size" -gt "$limit" ] || continue
  name=$(basename "$wheel")
  split -d -a 2 -n $(((size + limit - 1) / limit)) "$wheel" "$pieces/$name.part"
  (cd "$out/all" && sha256sum "$name") > "$pieces/$name.sha256"
done

# First fit, largest first: each file goes into the first part with room for it.
used=()
place() {
  local file=$1 size k
  size=$(stat -c %s "$file")
  for ((k = 0; k < ${#used[@]}; k++)); do
    [ $((used[k] + size)) -le "$limit" ] && break
  done
  [ "$k" -lt "${#used[@]}" ] || used+=(0)
  mkdir -p "$out/part$k"
  cp "$file" "$out/part$k/"
  used[k]=$((used[k] + size))
}
while read -r file; do
  size=$(stat -c %s "$file")
  if [[ $file == "$out/all/"* && $size -gt $limit ]]; then continue; fi  # travels as pieces
  place "$file"
done < <(find "$pieces" "$out/all" -type f \( -name '*.whl' -o -name '*.whl.part*' -o -name '*.sha256' \) -printf '%s\t%p\n' \
         | sort -t $'\t' -k1,1rn -k2,2 | cut -f2)
du -sh "$out"/part[0-9]*
echo "Send each of $out/part0 ... part$((${#used[@]} - 1)) to the host, into one folder (or under .gpu_wheels there)."
