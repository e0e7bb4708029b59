#!/usr/bin/env bash
# install.sh — install the systemd bundle that `pdsvc render` wrote into units/.
#
# Every path comes from units/install.list (written by the renderer from the plan); this script
# derives none. It never overwrites a file an admin edited in place (it shows the diff and
# refuses without --force), never touches a *.d/ drop-in directory, records what it installed
# in a manifest so that --uninstall removes exactly that, and ends by printing systemd's real
# state — never an unconditional "success".
#
# Usage: sudo ./install.sh [options]
#   --bundle DIR      the rendered bundle (default: units/ beside this script)
#   --unit-dir DIR    where units go (default: /etc/systemd/system)
#   --start           start the target after installing (default: enable only)
#   --force           replace units an admin edited in place (their diff is shown first)
#   --dry-run         print every action, change nothing
#   --uninstall       stop the stack and remove exactly what the manifest lists
#   --purge           with --uninstall: also remove the JIT cache, state dir and env files
#   -h, --help
# DESTDIR=/path installs into a staging root for packaging (no systemctl, no useradd).
#
# Exit codes: 0 done · 1 refused or failed (the message says why) · 2 usage.
set -euo pipefail

main() {
    local here bundle unit_dir="/etc/systemd/system" start=0 force=0 dry=0 uninstall=0 purge=0
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    bundle="$here/units"
    while [ $# -gt 0 ]; do
        case "$1" in
            --bundle) bundle="${2:?--bundle needs a directory}"; shift ;;
            --unit-dir) unit_dir="${2:?--unit-dir needs a directory}"; shift ;;
            --start) start=1 ;;
            --force) force=1 ;;
            --dry-run) dry=1 ;;
            --uninstall) uninstall=1 ;;
            --purge) purge=1 ;;
            -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) printf 'install.sh: unknown option %s (see --help)\n' "$1" >&2; exit 2 ;;
        esac
        shift
    done
    DRY=$dry
    DEST="${DESTDIR:-}"
    LIST="$bundle/install.list"

    [ -f "$LIST" ] || die "$bundle/install.list not found: run \`pdsvc render\` first (or pass --bundle DIR)"
    read_list
    MANIFEST="$DEST/var/lib/pdsvc/$NAME.manifest"

    if [ -z "$DEST" ] && [ "$DRY" = 0 ]; then
        [ "$(id -u)" = 0 ] || die "must run as root (sudo ./install.sh); --dry-run shows what it would do"
    fi
    if [ -z "$DEST" ]; then
        [ -d /run/systemd/system ] || die "systemd is not PID 1 here (no /run/systemd/system): \
use the supervisord bundle instead (pdsvc render --format supervisord)"
    fi

    if [ "$uninstall" = 1 ]; then
        do_uninstall "$unit_dir" "$purge" "$force"
    else
        check_fresh "$here"
        do_install "$bundle" "$unit_dir" "$force" "$start"
    fi
}

status() { printf '>>> %s\n' "$*"; }
warn() { printf 'install.sh: warning: %s\n' "$*" >&2; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }
# run CMD...: execute, or only print it under --dry-run
run() {
    if [ "$DRY" = 1 ]; then printf '    would run: %s\n' "$*"; else "$@"; fi
}
report() { printf '  %-10s %s\n' "$1" "$2"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
# manifest_hash PATH: the sha256 install.sh recorded for PATH ('' if none)
manifest_hash() {
    local kind path hash
    while IFS=$'\t' read -r kind path hash; do
        if [ "$kind" = file ] && [ "$path" = "$1" ]; then printf '%s' "$hash"; return; fi
    done < "$MANIFEST"
}

# Parse install.list into globals (tab-separated; see the renderer's template).
read_list() {
    NAME="" TARGET="" SVC_USER="" SVC_GROUP="" STATE_HOME=""
    UNITS=() FILES=() DIRS=() ENVFILES=()
    local kind a b c d
    while IFS=$'\t' read -r kind a b c d; do
        case "$kind" in
            ''|'#'*) ;;
            name) NAME="$a" ;;
            target) TARGET="$a" ;;
            user) SVC_USER="$a"; SVC_GROUP="$b"; STATE_HOME="$c" ;;
            unit) UNITS+=("$a") ;;
            file) FILES+=("$a	$b	$c") ;;
            dir) DIRS+=("$a	$c	$d") ;;
            envfile) ENVFILES+=("$a	$c	$d") ;;
            *) die "$LIST: unknown entry '$kind' (rendered by a newer pdsvc?)" ;;
        esac
    done < "$LIST"
    if [ -z "$NAME" ] || [ -z "$TARGET" ] || [ -z "$SVC_USER" ]; then
        die "$LIST is incomplete; run \`pdsvc render\` again"
    fi
}

# Refuse a bundle rendered from an older config: the header records the config's sha256.
check_fresh() {
    local root="$1" src want have
    src="$(sed -n 's/^# Source: \([^ ]*\) (sha256 \([0-9a-f]*\)).*/\1/p' "$LIST" | head -n1)"
    want="$(sed -n 's/^# Source: [^ ]* (sha256 \([0-9a-f]*\)).*/\1/p' "$LIST" | head -n1)"
    case "$src" in /*) ;; *) src="$root/$src" ;; esac
    if [ -f "$src" ]; then
        have="$(sha "$src" | cut -c1-${#want})"
        [ "$have" = "$want" ] || die "$src changed since the bundle was rendered: run \`pdsvc render\` first"
    fi
}

# install_file SRC DEST MODE: created / unchanged / updated; refuses admin edits without --force.
install_file() {
    local src="$1" dest="$2" mode="$3" force="$4" recorded=""
    if [ -f "$MANIFEST" ]; then
        recorded="$(manifest_hash "${dest#"$DEST"}")"
    fi
    if [ ! -e "$dest" ]; then
        run install -D -m "$mode" "$src" "$dest"
        report created "$dest"; CHANGED=1
    elif cmp -s "$src" "$dest"; then
        report unchanged "$dest"
    else
        if [ "$(sha "$dest")" != "$recorded" ] && [ "$force" = 0 ]; then
            diff -u "$dest" "$src" >&2 || true
            die "$dest was edited in place (not what install.sh last wrote); refusing to overwrite it.
  Keep your change in a drop-in instead: systemctl edit $(basename "$dest")
  (or /etc/systemd/system/$NAME-.service.d/*.conf for every $NAME unit), then re-run;
  or re-run with --force to replace it (the diff above is what you would lose)."
        fi
        run install -D -m "$mode" "$src" "$dest"
        report updated "$dest"; CHANGED=1
    fi
    NEW_MANIFEST+=("file	${dest#"$DEST"}	$(sha "$src")")
}

ensure_dir() {
    local path="$1" mode="$2" owner="$3"
    if [ -d "$DEST$path" ]; then
        report unchanged "$DEST$path/"
    else
        run install -d -m "$mode" "$DEST$path"
        report created "$DEST$path/"; CHANGED=1
    fi
    [ -n "$DEST" ] || run chown "$owner" "$DEST$path"
    NEW_MANIFEST+=("dir	$path	-")
}

ensure_user() {
    if [ -n "$DEST" ]; then
        report skipped "user $SVC_USER (DESTDIR set: create it in the package's postinst)"
        return
    fi
    if getent group "$SVC_GROUP" >/dev/null; then
        report unchanged "group $SVC_GROUP"
    else
        run groupadd --system "$SVC_GROUP"; report created "group $SVC_GROUP"; CHANGED=1
        NEW_MANIFEST+=("group	$SVC_GROUP	-")
    fi
    if getent passwd "$SVC_USER" >/dev/null; then
        report unchanged "user $SVC_USER"
    else
        run useradd --system --gid "$SVC_GROUP" --home-dir "$STATE_HOME" --no-create-home \
            --shell /usr/sbin/nologin --comment "$NAME PD serving (pdsvc)" "$SVC_USER"
        report created "user $SVC_USER"; CHANGED=1
        NEW_MANIFEST+=("user	$SVC_USER	-")
    fi
    # The GPU device nodes belong to video/render on many distributions.
    local g
    for g in video render; do
        if getent group "$g" >/dev/null && ! id -nG "$SVC_USER" 2>/dev/null | tr ' ' '\n' | grep -qx "$g"; then
            run usermod -a -G "$g" "$SVC_USER"; report updated "user $SVC_USER: + group $g"; CHANGED=1
        fi
    done
    # keep the user/group entries of an earlier install in the manifest
    if [ -f "$MANIFEST" ]; then
        while IFS= read -r line; do NEW_MANIFEST+=("$line"); done < <(grep -E '^(user|group)	' "$MANIFEST" || true)
    fi
}

do_install() {
    local bundle="$1" unit_dir="$2" force="$3" start="$4" entry src dest mode owner path unit
    CHANGED=0 NEW_MANIFEST=()
    status "installing $NAME from $bundle$([ "$DRY" = 1 ] && echo ' (dry run: nothing changes)')"
    ensure_user
    for entry in "${DIRS[@]}"; do
        IFS=$'\t' read -r path mode owner <<<"$entry"
        ensure_dir "$path" "$mode" "$owner"
    done
    for entry in "${ENVFILES[@]}"; do
        IFS=$'\t' read -r path mode owner <<<"$entry"
        if [ -e "$DEST$path" ]; then
            report kept "$DEST$path (yours: never overwritten)"
        else
            run install -m "$mode" /dev/null "$DEST$path"
            [ -n "$DEST" ] || run chown "$owner" "$DEST$path"
            report created "$DEST$path (empty; put secrets such as API keys here)"; CHANGED=1
            NEW_MANIFEST+=("envfile	$path	empty")
        fi
    done
    for unit in "${UNITS[@]}"; do
        install_file "$bundle/$unit" "$DEST$unit_dir/$unit" 0644 "$force"
    done
    for entry in "${FILES[@]}"; do
        IFS=$'\t' read -r src dest mode <<<"$entry"
        install_file "$bundle/$src" "$DEST$dest" "$mode" "$force"
    done
    if [ -f "$MANIFEST" ]; then
        while IFS= read -r line; do NEW_MANIFEST+=("$line"); done < <(grep -E '^envfile	' "$MANIFEST" || true)
    fi
    write_manifest "$unit_dir"
    if [ -n "$DEST" ]; then
        status "staged under DESTDIR=$DEST; enable $TARGET in the package (systemctl enable $TARGET)"
        return
    fi
    if [ "$CHANGED" = 1 ]; then run systemctl daemon-reload; fi
    if [ "$(systemctl is-enabled "$TARGET" 2>/dev/null || true)" != enabled ]; then
        run systemctl enable "$TARGET"
    fi
    if [ "$start" = 1 ]; then
        status "starting $TARGET (returns when the stack serves; follow: journalctl -f -u '$NAME-*')"
        run systemctl start "$TARGET" || { show_state; die "$TARGET failed to start: systemctl status '$NAME-*'"; }
    fi
    [ "$CHANGED" = 1 ] || status "nothing changed"
    show_state
}

write_manifest() {
    local unit_dir="$1"
    if [ "$DRY" = 1 ]; then printf '    would write: %s\n' "$MANIFEST"; return; fi
    mkdir -p "$(dirname "$MANIFEST")"
    {
        printf '# pdsvc install manifest for %s: what install.sh created; --uninstall removes it\n' "$NAME"
        printf 'target\t%s\t%s\n' "$TARGET" "$unit_dir"
        local -A seen=()
        local line
        for line in "${NEW_MANIFEST[@]}"; do
            [ -n "${seen[$line]:-}" ] || printf '%s\n' "$line"
            seen[$line]=1
        done
    } > "$MANIFEST.tmp"
    mv "$MANIFEST.tmp" "$MANIFEST"
}

show_state() {
    local u
    status "state (from systemd):"
    for u in "${UNITS[@]}"; do
        printf '  %-28s enabled=%-10s active=%s\n' "$u" \
            "$(systemctl is-enabled "$u" 2>/dev/null || true)" "$(systemctl is-active "$u" 2>/dev/null || true)"
    done
}

do_uninstall() {
    local unit_dir="$1" purge="$2" force="$3" kind path hash
    [ -f "$MANIFEST" ] || die "no manifest at $MANIFEST: nothing was installed by install.sh for $NAME"
    status "uninstalling $NAME (manifest $MANIFEST)$([ "$DRY" = 1 ] && echo ' (dry run: nothing changes)')"
    if [ -z "$DEST" ]; then
        run systemctl disable --now "$TARGET" || warn "could not stop/disable $TARGET"
        run systemctl stop "${UNITS[@]}" || true
    fi
    # files first (refusing edited ones without --force), then dirs, then user/group
    while IFS=$'\t' read -r kind path hash; do
        [ "$kind" = file ] || continue
        if [ ! -e "$DEST$path" ]; then report gone "$DEST$path"; continue; fi
        if [ "$(sha "$DEST$path")" != "$hash" ] && [ "$force" = 0 ]; then
            warn "$DEST$path was edited after install: kept (remove it yourself, or --force)"
            continue
        fi
        run rm -f "$DEST$path"; report removed "$DEST$path"
    done < "$MANIFEST"
    while IFS=$'\t' read -r kind path hash; do
        case "$kind" in
            envfile)
                if [ "$purge" = 1 ] || [ ! -s "$DEST$path" ]; then
                    run rm -f "$DEST$path"; report removed "$DEST$path"
                else
                    report kept "$DEST$path (not empty: yours; --purge removes it)"
                fi ;;
        esac
    done < "$MANIFEST"
    while IFS=$'\t' read -r kind path hash; do
        [ "$kind" = dir ] || continue
        [ -d "$DEST$path" ] || continue
        if [ "$purge" = 1 ]; then
            run rm -rf "$DEST$path"; report removed "$DEST$path/"
        elif rmdir "$DEST$path" 2>/dev/null; then
            report removed "$DEST$path/ (empty)"
        else
            report kept "$DEST$path/ (not empty; --purge removes it)"
        fi
    done < <(tac "$MANIFEST")
    if [ -z "$DEST" ] && [ "$purge" = 1 ]; then
        while IFS=$'\t' read -r kind path hash; do
            case "$kind" in
                user) run userdel "$path" && report removed "user $path" ;;
                group) if run groupdel "$path" 2>/dev/null; then report removed "group $path"; fi ;;
            esac
        done < "$MANIFEST"
    fi
    run rm -f "$MANIFEST"
    rmdir "$(dirname "$MANIFEST")" 2>/dev/null || true
    [ -n "$DEST" ] || run systemctl daemon-reload
    [ -n "$DEST" ] || show_state
}

main "$@"
