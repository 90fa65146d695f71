# tests/pip_site.sh: sourced by the tests that need Python packages Debian
# does not package (transformers 4.44, tokenizers).  They are installed
# with pip --target --no-deps into a cache directory of their own (without
# --no-deps pip would replace Debian's torch 1.13).
#
#   pip_site SITE PROBE PKG...
#
# Installs PKG... into SITE (into a temporary directory beside it, then
# renamed, so a concurrent or interrupted install never leaves a half-filled
# directory in use) and checks it with `PROBE SITE`.  Returns 1 at once,
# with the reason in PIP_SITE_WHY, when MALLEUS_HF_INSTALL=0, when there is
# no pip, or when an install failed within the last MALLEUS_PIP_RETRY
# seconds (default 21600, six hours; the marker is
# ${XDG_CACHE_HOME:-~/.cache}/malleus/pip-failed, remove it to retry now):
# on a machine without a package index (CI reaches only Debian's) the first
# test pays for one failed attempt, bounded to 120 s, and every other test
# and suite skips without waiting on the network again.
PIP_SITE_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/malleus
PIP_SITE_WHY=
pip_site() {
    _site=$1
    _probe=$2
    shift 2
    _py=${PYTHON3:-/usr/bin/python3}
    _marker=$PIP_SITE_CACHE/pip-failed
    if [ "${MALLEUS_HF_INSTALL:-1}" = 0 ]; then
        PIP_SITE_WHY="not installed: MALLEUS_HF_INSTALL=0"
        return 1
    fi
    if ! "$_py" -m pip --version >/dev/null 2>&1; then
        PIP_SITE_WHY="no pip to install $1"
        return 1
    fi
    if [ -f "$_marker" ]; then
        _age=$(($(date +%s) - $(stat -c %Y "$_marker" 2>/dev/null || echo 0)))
        if [ "$_age" -lt "${MALLEUS_PIP_RETRY:-21600}" ]; then
            PIP_SITE_WHY="a pip install failed here ${_age} s ago ($(head -n 1 "$_marker")); remove $_marker to retry"
            return 1
        fi
    fi
    mkdir -p "$(dirname "$_site")" "$PIP_SITE_CACHE" 2>/dev/null || {
        PIP_SITE_WHY="cannot create $(dirname "$_site")"
        return 1
    }
    _tmp=$(mktemp -d "$_site.tmp.XXXXXX") || {
        PIP_SITE_WHY="cannot create a directory beside $_site"
        return 1
    }
    echo "pip_site: installing $* into $_site (pip --target, --no-deps)"
    timeout 120 "$_py" -m pip install -q --disable-pip-version-check --no-deps \
        --timeout 10 --retries 0 --target "$_tmp" "$@" >"$_tmp.log" 2>&1
    _rc=$?
    if [ $_rc -ne 0 ] || ! "$_probe" "$_tmp"; then
        tail -n 3 "$_tmp.log"
        echo "pip exit $_rc installing $*" >"$_marker"
        rm -rf "$_tmp" "$_tmp.log"
        PIP_SITE_WHY="$1 cannot be installed here (pip exit $_rc)"
        return 1
    fi
    rm -f "$_tmp.log" "$_marker"
    mv -T "$_tmp" "$_site" 2>/dev/null || rm -rf "$_tmp" # another run won: use its copy
    "$_probe" "$_site" || {
        PIP_SITE_WHY="$_site does not provide $1"
        return 1
    }
}
