# Source this file to run Tracea from a source checkout without installing it:
#   source scripts/srcenv.sh && python -m pytest packages/tracea-core/tests
# It puts every package's src/ on PYTHONPATH and lists the backend plugins in TRACEA_PLUGINS
# (entry points exist only for installed distributions).
_tracea_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
_tracea_pp=""
for _d in "$_tracea_root"/packages/*/src; do _tracea_pp="$_tracea_pp${_tracea_pp:+:}$_d"; done
export PYTHONPATH="$_tracea_pp${PYTHONPATH:+:$PYTHONPATH}"
export TRACEA_PLUGINS="${TRACEA_PLUGINS:-cpu=tracea_cpu.plugin,cuda=tracea_cuda.plugin,opencl=tracea_opencl.plugin,torch=tracea_torch.plugin}"
export TRACEA_DISABLE_PLUGIN_AUTOLOAD=1
unset _tracea_pp _d
