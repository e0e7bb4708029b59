#!/usr/bin/env bash
# install.sh — install the systemd bundle that `pdsvc render` wrote into units/.
#
# Every path comes from units/install.list (written by the renderer from the plan); this script
# derives none. It never overwrites a file an admin edited in place (it shows the diff and
# refuses, before changing anything, unless --force), never touches a *.d/ drop-in directory,
# records what it created in a manifest (/var/lib/pdsvc/NAME.manifest) so that --uninstall
# removes exactly that, and ends by printing systemd's real state — never an unconditional
# "success". The target is enabled when its units are first installed and started only with
# --start; a re-install keeps the enablement the admin chose (`systemctl disable` sticks).
#
# Usage: sudo ./install.sh [options]
#   --bundle DIR      the rendered bundle (default: units/ beside this script)
#   --config FILE     the config the bundle was rendered from, to check that the bundle is
#                     current (default: the config path install.list records; if that is not
#                     here, the file of that name beside the bundle directory)
#   --unit-dir DIR    where units go (default: /etc/systemd/system)
#   --key-from FILE   on an engine host of several: install FILE, the router host's
#                     control-plane key (/etc/NAME/router.key there, made by its install.sh),
#                     root:GROUP 0640; a key that is not one token (RFC 6750 b64token) is
#                     refused. The router's host makes its own and refuses this option.
#   --start           start the target after installing, and fail unless every unit is active
#   --force           replace (or with --uninstall: remove) files edited in place; diff shown
#   --dry-run         print every action, change nothing (allowed without root)
#   --uninstall       stop and disable the stack, remove exactly what the manifest lists; the
#                     JIT cache, state dir, env files you filled and the service user stay
#   --purge           with --uninstall: remove those too
#   -h, --help
# DESTDIR=/path stages the files under /path for packaging: no systemctl, no useradd/chown,
# no root needed (the package's postinst creates the user and enables the target).
#
# Refusals (exit 1, before anything changes): not root (unless --dry-run or DESTDIR); systemd
# is not PID 1 (also with --dry-run, since the real run would refuse the same way; DESTDIR
# needs no systemd); no bundle; a bundle older than its config; a file edited in place;
# --key-from on a host that makes the key or reads none, or with a malformed key.
#
# Exit codes: 0 done · 1 refused or failed (the message says why) · 2 usage.
set -euo pipefail

main() {
    local here bundle config="" unit_dir="/etc/systemd/system" start=0 force=0 uninstall=0 purge=0
    KEY_FROM=""
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    bundle="$here/units"
    DRY=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --bundle) bundle="${2:?--bundle needs a directory}"; shift ;;
            --config) config="${2:?--config needs a file}"; shift ;;
            --unit-dir) unit_dir="${2:?--unit-dir needs a directory}"; shift ;;
            --key-from) KEY_FROM="${2:?--key-from needs a file}"; shift ;;
            --start) start=1 ;;
            --force) force=1 ;;
            --dry-run) DRY=1 ;;
            --uninstall) uninstall=1 ;;
            --purge) purge=1 ;;
            -h|--help) sed -n '/^set -euo/q; 2,$ s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
            *) usage_error "unknown option $1" ;;
        esac
        shift
    done
    DEST="${DESTDIR:-}"
    DEST="${DEST%/}"
    case "$DEST" in ''|/*) ;; *) usage_error "DESTDIR must be an absolute path" ;; esac
    [ "$purge" = 0 ] || [ "$uninstall" = 1 ] || usage_error "--purge only goes with --uninstall"
    if [ "$start" = 1 ] && { [ "$uninstall" = 1 ] || [ -n "$DEST" ]; }; then
        usage_error "--start does not go with --uninstall or DESTDIR"
    fi
    [ -z "$KEY_FROM" ] || [ "$uninstall" = 0 ] || usage_error "--key-from does not go with --uninstall"
    unit_dir="${unit_dir%/}"

    # Refusals come first, before anything is read or changed.
    if [ -z "$DEST" ] && [ "$DRY" = 0 ] && [ "$(id -u)" != 0 ]; then
        die "must run as root (sudo ./install.sh); --dry-run shows what it would do"
    fi
    if [ -z "$DEST" ] && [ ! -d /run/systemd/system ]; then
        die "systemd is not PID 1 here (no /run/systemd/system), so the units cannot run: \
install on a host booted with systemd (without one: pdsvc's supervisord bundle), or stage \
the files for a package with DESTDIR=DIR"
    fi
    LIST="$bundle/install.list"
    if [ ! -f "$LIST" ] && [ -f "$bundle/hosts.list" ]; then
        # a bundle for several hosts (config with `hosts:`): one subdirectory per host
        local hosts
        hosts="$(awk -F'\t' '!/^#/ && NF { printf "%s%s", sep, $1; sep=", " }' "$bundle/hosts.list")"
        die "$bundle holds one bundle per host ($hosts): on each host run \
install.sh --bundle $bundle/HOST"
    fi
    [ -f "$LIST" ] || die "$LIST not found: run \`pdsvc render\` first (or pass --bundle DIR)"
    [ -r "$LIST" ] || die "cannot read $LIST"
    read_list
    [ -z "$KEY_FROM" ] || read_key_from
    MANIFEST="$DEST/var/lib/pdsvc/$NAME.manifest"
    load_manifest

    if [ "$uninstall" = 1 ]; then
        do_uninstall "$bundle" "$purge" "$force"
    else
        check_fresh "$here" "$bundle" "$config"
        do_install "$bundle" "$unit_dir" "$force" "$start"
    fi
}

status() { printf '>>> %s\n' "$*"; }
warn() { printf 'install.sh: warning: %s\n' "$*" >&2; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'install.sh: %s (see --help)\n' "$*" >&2; exit 2; }
# run CMD...: execute, or only print it under --dry-run
run() {
    if [ "$DRY" = 1 ]; then printf '    would run: %s\n' "$*"; else "$@"; fi
}
# report VERB WHAT: one line per item; a dry run says what it would do
report() {
    local verb="$1"
    if [ "$DRY" = 1 ]; then
        case "$verb" in created|updated|removed|enabled) verb="would ${verb%d}" ;; esac
    fi
    printf '  %-13s %s\n' "$verb" "$2"
}
sha() { local h; h="$(sha256sum < "$1")"; printf '%s' "${h%% *}"; }
dry_note() { if [ "$DRY" = 1 ]; then printf ' (dry run: nothing changes)'; fi; }

# Parse install.list into globals (tab-separated; see the renderer's template).
read_list() {
    NAME="" TARGET="" SVC_USER="" SVC_GROUP="" STATE_HOME="" CONFIG_SRC="" CONFIG_SHA=""
    KEY_HOST="" KEY_ADDRESS=""
    UNITS=() FILES=() DIRS=() ENVFILES=() SECRETS=()
    local kind a b c d
    while IFS=$'\t' read -r kind a b c d; do
        case "$kind" in
            ''|'#'*) ;;
            name) NAME="$a" ;;
            target) TARGET="$a" ;;
            config) CONFIG_SRC="$a" CONFIG_SHA="$b" ;;
            user) SVC_USER="$a"; SVC_GROUP="$b"; STATE_HOME="$c" ;;
            unit) UNITS+=("$a") ;;
            file) FILES+=("$a	$b	$c") ;;
            dir) DIRS+=("$a	$c	$d") ;;
            envfile) ENVFILES+=("$a	$c	$d") ;;
            secret) SECRETS+=("$a	$c	$d	$b") ;;
            keyhost) KEY_HOST="$a" KEY_ADDRESS="$b" ;;
            *) die "$LIST: unknown entry '$kind' (rendered by a newer pdsvc?)" ;;
        esac
    done < "$LIST"
    if [ -z "$NAME" ] || [ -z "$TARGET" ] || [ -z "$SVC_USER" ]; then
        die "$LIST is incomplete; run \`pdsvc render\` again"
    fi
}

# --key-from FILE, checked before anything changes: this host's units read the router's key
# and do not make it, and FILE holds one key as the router takes it — a Bearer token
# (RFC 6750 section 2.1, b64token: no space, no ':', which would split the router's
# --control-plane-api-keys ID:NAME:ROLE:KEY entry). KEY holds it from here on; never printed.
read_key_from() {
    local e how="" path=""
    for e in "${SECRETS[@]}"; do IFS=$'\t' read -r path _ _ how <<<"$e"; done
    case "$how" in
        make) die "--key-from: the router runs on this host, so install.sh makes its \
control-plane key here ($path) and the other hosts copy it from here; run without --key-from" ;;
        copy) ;;
        *) die "--key-from: no unit of this host reads the router's control-plane key \
(it runs no engine that registers with the router); run without --key-from" ;;
    esac
    if [ ! -f "$KEY_FROM" ] || [ ! -r "$KEY_FROM" ]; then
        die "--key-from $KEY_FROM: no such readable file"
    fi
    local lines
    lines="$(wc -l < "$KEY_FROM")"
    KEY="$(cat "$KEY_FROM")"
    if [ "$lines" -gt 1 ] || ! [[ "$KEY" =~ ^[A-Za-z0-9._~+/-]{16,}=*$ ]]; then
        KEY=""
        die "--key-from $KEY_FROM is not a control-plane key (one line of at least 16 \
letters, digits or -._~+/, as install.sh makes it on the router's host: 64 hex digits); \
copy $path from ${KEY_HOST:-the router host} again"
    fi
}

# ---------------------------------------------------------------------------- the manifest
# One line per thing install.sh created, tab-separated: KIND PATH INFO, where KIND is
#   file    a file it installed (INFO: the sha256 it wrote; a different one = edited in place)
#   dir     a directory from install.list it created (the JIT cache, state dir, env dir)
#   parent  a missing parent directory it created on the way (removed again when empty)
#   envfile an env file it created empty (removed on uninstall while still empty)
#   secret  a key it generated (the router's control-plane key; removed on uninstall)
#   user, group, member (INFO: the group)   accounts it created / group memberships it added
#   enabled the target, once install.sh enabled it (or found it enabled): from then on the
#           admin's `systemctl disable` is respected
# plus `target TARGET UNIT_DIR`. Nothing that existed before is recorded, so nothing that
# existed before is removed.
load_manifest() {
    OLD=()
    M_UNIT_DIR=""
    [ -f "$MANIFEST" ] || return 0
    local kind path info
    while IFS=$'\t' read -r kind path info; do
        case "$kind" in
            ''|'#'*) ;;
            target) M_UNIT_DIR="$info" ;;
            file|dir|parent|envfile|secret|user|group|member|enabled) OLD+=("$kind	$path	$info") ;;
            *) warn "$MANIFEST: unknown entry '$kind' ignored" ;;
        esac
    done < "$MANIFEST"
}

# old_info KIND PATH: print INFO of that entry of the previous manifest; fail if none
old_info() {
    local e k p i
    for e in "${OLD[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        if [ "$k" = "$1" ] && [ "$p" = "$2" ]; then printf '%s' "$i"; return 0; fi
    done
    return 1
}

# add_entry KIND PATH INFO: record in the new manifest (first one wins)
add_entry() {
    local key="$1	$2"
    if [ -z "${NEW_KEYS[$key]:-}" ]; then
        NEW_KEYS[$key]=1
        NEW_MANIFEST+=("$1	$2	$3")
    fi
}

# write_manifest FILE TITLE LINES...: atomically, or only say so under --dry-run
write_manifest() {
    local file="$1" title="$2" line
    shift 2
    if [ "$DRY" = 1 ]; then printf '    would write: %s\n' "$file"; return 0; fi
    mkdir -p "$(dirname "$file")"
    {
        printf '# pdsvc install manifest for %s: %s\n' "$NAME" "$title"
        printf 'target\t%s\t%s\n' "${TARGET}" "${UNIT_DIR:-$M_UNIT_DIR}"
        for line in "$@"; do printf '%s\n' "$line"; done
    } > "$file.tmp"
    mv "$file.tmp" "$file"
}

# If an install fails half-way, record what it did so far (plus what the old manifest had),
# so that a re-run or --uninstall still knows what is ours.
on_exit() {
    local rc=$? e k p i
    if [ "${UNINSTALLING:-0}" = 1 ] && [ "$DRY" = 0 ]; then
        write_manifest "$MANIFEST" "an uninstall that FAILED; re-run it" "${OLD[@]}" || true
        printf 'install.sh: error: uninstall stopped half-way; %s is restored\n' "$MANIFEST" >&2
    fi
    if [ "${INSTALLING:-0}" = 1 ] && [ "$DRY" = 0 ]; then
        for e in "${OLD[@]}"; do
            IFS=$'\t' read -r k p i <<<"$e"
            add_entry "$k" "$p" "$i"
        done
        write_manifest "$MANIFEST" "a FAILED install; re-run install.sh, or --uninstall" \
            "${NEW_MANIFEST[@]}" || true
        printf 'install.sh: error: stopped half-way; %s records what was done\n' "$MANIFEST" >&2
    fi
    exit "$rc"
}

# by_depth LINE...: manifest lines, deepest path first
by_depth() {
    local e p n max=0
    local -A at=()
    for e in "$@"; do
        p="${e#*	}"; p="${p%%	*}"; n="${p//[!\/]/}"
        at[${#n}]+="$e"$'\n'
        if [ "${#n}" -gt "$max" ]; then max="${#n}"; fi
    done
    for ((n = max; n >= 0; n--)); do printf '%s' "${at[$n]:-}"; done
}

# empty_after DIR: DIR is empty — or, in a dry run, would be once what we remove is gone
empty_after() {
    local e
    while IFS= read -r -d '' e; do
        [ -n "${GONE[$e]:-}" ] || return 1
    done < <(find "$1" -mindepth 1 -maxdepth 1 -print0 2>/dev/null)
    return 0
}

# remove_dir_if_empty DIR WHY-KEPT: rmdir when (it would be) empty; fail (and report) otherwise
remove_dir_if_empty() {
    if empty_after "$1" && { [ "$DRY" = 1 ] || rmdir "$1" 2>/dev/null; }; then
        [ "$DRY" = 0 ] || printf '    would run: rmdir %s\n' "$1"
        GONE[$1]=1
        report removed "$1/"
        return 0
    fi
    report kept "$1/ ($2)"
    return 1
}

# ---------------------------------------------------------------------------- checks
# Refuse a bundle rendered from an older config: install.list's `config` line records the
# config's path and sha256, as data.
check_fresh() {
    local here="$1" bundle="$2" config="$3" src want have parent cand
    src="$CONFIG_SRC" want="$CONFIG_SHA"
    if [ -z "$want" ]; then
        warn "$LIST records no config checksum: cannot tell whether the bundle is current"
        return 0
    fi
    if [ -n "$config" ]; then
        [ -f "$config" ] || die "--config $config: no such file"
    else
        parent="$(cd "$bundle/.." && pwd)"
        local cands=()
        case "$src" in
            /*) cands=("$src" "$parent/${src##*/}") ;;
            *) cands=("$here/$src" "$parent/$src" "$PWD/$src") ;;
        esac
        for cand in "${cands[@]}"; do
            if [ -f "$cand" ]; then config="$cand"; break; fi
        done
    fi
    if [ -z "$config" ]; then
        warn "cannot check that the bundle is current: its config $src is not here (pass --config FILE)"
        return 0
    fi
    [ -r "$config" ] || die "cannot read $config (to check that the bundle is current)"
    have="$(sha "$config")"
    [ "${have:0:${#want}}" = "$want" ] || die "$config changed since the bundle in $bundle was \
rendered from it (sha256 $want): run \`pdsvc render\` first"
    status "bundle $bundle is current (rendered from $config)"
}

# Before changing anything: a destination that differs from the bundle and from what
# install.sh last wrote there was edited in place (or is someone else's): show the diff and
# refuse, all of them at once, unless --force.
preflight() {
    local bundle="$1" unit_dir="$2" force="$3" entry src dest mode recorded conflicts=() hints=()
    local pairs=()
    for entry in "${UNITS[@]}"; do pairs+=("$bundle/$entry	$DEST$unit_dir/$entry"); done
    for entry in "${FILES[@]}"; do
        IFS=$'\t' read -r src dest mode <<<"$entry"
        pairs+=("$bundle/$src	$DEST$dest")
    done
    for entry in "${pairs[@]}"; do
        IFS=$'\t' read -r src dest <<<"$entry"
        [ -f "$src" ] || die "$src missing from the bundle: run \`pdsvc render\` again"
        if [ ! -e "$dest" ] && [ ! -L "$dest" ]; then continue; fi
        if [ ! -L "$dest" ] && [ -f "$dest" ] && cmp -s "$src" "$dest"; then continue; fi
        if recorded="$(old_info file "${dest#"$DEST"}")" && [ ! -L "$dest" ] && [ -f "$dest" ] \
            && [ "$(sha "$dest")" = "$recorded" ]; then
            continue  # what install.sh wrote last time: an update
        fi
        conflicts+=("$dest")
        if [ -f "$dest" ]; then
            diff -u --label "$dest (now)" --label "$src (bundle)" "$dest" "$src" >&2 || true
        fi
        case "$dest" in
            *.service|*.target) hints+=("  $dest: keep your change in a drop-in instead: systemctl edit ${dest##*/}") ;;
            *) hints+=("  $dest: a copy of the bundle's ${src##*/}; change that in pdsvc and re-render") ;;
        esac
    done
    [ ${#conflicts[@]} -gt 0 ] || return 0
    if [ "$force" = 1 ]; then
        warn "--force: replacing what was edited in place (diff above): ${conflicts[*]}"
        return 0
    fi
    die "$(printf '%s\n' "refusing to overwrite what was edited in place (not what install.sh \
last wrote; the diff above is what you would lose). Nothing was changed." "${hints[@]}" \
        "  Drop-ins (/etc/systemd/system/UNIT.d/*.conf, or $NAME-.service.d/ for every $NAME \
unit) are never touched." "  Or re-run with --force to replace them.")"
}

# ---------------------------------------------------------------------------- install
# make_parents DIR: create DIR's missing ancestors (and DIR), recording each
make_parents() {
    local d="$1" missing=()
    while [ -n "$d" ] && [ "$d" != / ] && [ "$d" != "$DEST" ] && [ ! -d "$d" ]; do
        missing=("$d" "${missing[@]}")
        d="$(dirname "$d")"
    done
    for d in "${missing[@]}"; do
        [ -z "${MADE[$d]:-}" ] || continue
        MADE[$d]=1
        run install -d -m 0755 "$d"
        report created "$d/"; CHANGED=1
        add_entry parent "${d#"$DEST"}" -
    done
}

# install_file SRC DEST MODE: created / unchanged / updated (preflight already refused edits)
install_file() {
    local src="$1" dest="$2" mode="$3"
    if [ ! -e "$dest" ] && [ ! -L "$dest" ]; then
        make_parents "$(dirname "$dest")"
        run install -m "$mode" "$src" "$dest"
        report created "$dest"; CHANGED=1; FILE_CHANGED=1
    elif [ ! -L "$dest" ] && cmp -s "$src" "$dest"; then
        report unchanged "$dest"
    else
        if [ -L "$dest" ]; then run rm -f "$dest"; fi
        run install -m "$mode" "$src" "$dest"
        report updated "$dest"; CHANGED=1; FILE_CHANGED=1
    fi
    add_entry file "${dest#"$DEST"}" "$(sha "$src")"
}

# ensure_dir PATH MODE OWNER: create it, or fix its mode/owner if they drifted
ensure_dir() {
    local path="$1" mode="$2" owner="$3" d="$DEST$1" want have ours=0
    want="$(printf '%o' "$((8#$mode))")"
    [ -z "$DEST" ] || owner="-"
    if [ -d "$d" ]; then
        have="$(stat -c '%a' "$d")"
        if [ "$owner" != - ]; then want="$want $owner"; have="$have $(stat -c '%U:%G' "$d")"; fi
        if [ "$have" = "$want" ]; then
            report unchanged "$d/"
        else
            run chmod "$mode" "$d"
            [ "$owner" = - ] || run chown "$owner" "$d"
            report updated "$d/ (was $have, now $want)"; CHANGED=1
        fi
        if old_info dir "$path" >/dev/null; then ours=1; fi
    else
        make_parents "$(dirname "$d")"
        run install -d -m "$mode" "$d"
        [ "$owner" = - ] || run chown "$owner" "$d"
        MADE[$d]=1
        report created "$d/"; CHANGED=1; ours=1
    fi
    if [ "$ours" = 1 ]; then add_entry dir "$path" -; fi
}

ensure_user() {
    if [ -n "$DEST" ]; then
        report skipped "user $SVC_USER, group $SVC_GROUP (DESTDIR: create them in the package's postinst)"
        return 0
    fi
    if getent group "$SVC_GROUP" >/dev/null; then
        report unchanged "group $SVC_GROUP"
    else
        run groupadd --system "$SVC_GROUP"; report created "group $SVC_GROUP"; CHANGED=1
        add_entry group "$SVC_GROUP" -
    fi
    if getent passwd "$SVC_USER" >/dev/null; then
        report unchanged "user $SVC_USER"
    else
        run useradd --system --gid "$SVC_GROUP" --home-dir "$STATE_HOME" --no-create-home \
            --shell /usr/sbin/nologin --comment "$NAME PD serving (pdsvc)" "$SVC_USER"
        report created "user $SVC_USER"; CHANGED=1
        add_entry user "$SVC_USER" -
    fi
    # The GPU device nodes belong to video/render on many distributions. (A membership is
    # recorded only for a user that was there before: userdel takes the others along.)
    local g created=0
    if [ -n "${NEW_KEYS[user	$SVC_USER]:-}" ] || old_info user "$SVC_USER" >/dev/null; then created=1; fi
    for g in video render; do
        getent group "$g" >/dev/null || continue
        if ! id -nG "$SVC_USER" 2>/dev/null | tr ' ' '\n' | grep -qx "$g"; then
            run usermod -a -G "$g" "$SVC_USER"
            report updated "user $SVC_USER: + group $g"; CHANGED=1
            if [ "$created" = 0 ]; then add_entry member "$SVC_USER" "$g"; fi
        fi
    done
}

# install_key DEST MODE OWNER: write $KEY (checked by read_key_from) to DEST atomically, made
# 0600 and filled before the service group may read it; unchanged when DEST holds it already.
install_key() {
    local d="$1" mode="$2" owner="$3"
    if [ -f "$d" ] && [ "$(cat "$d")" = "$KEY" ]; then
        report unchanged "$d (the router host's key)"
        return 0
    fi
    local verb=created
    if [ -e "$d" ]; then verb=updated; fi
    make_parents "$(dirname "$d")"
    if [ "$DRY" = 1 ]; then
        printf '    would write: the key from %s to %s (%s %s)\n' "$KEY_FROM" "$d" "$owner" "$mode"
    else
        install -m 0600 /dev/null "$d.tmp"
        printf '%s\n' "$KEY" > "$d.tmp"
        if [ -z "$DEST" ]; then chown "$owner" "$d.tmp"; fi
        chmod "$mode" "$d.tmp"
        mv -f "$d.tmp" "$d"
    fi
    report "$verb" "$d (the router host's key, from $KEY_FROM)"; CHANGED=1; KEY_CHANGED=1
}

# ensure_secret PATH MODE OWNER HOW: the router's control-plane key (its /workers API), which
# the engines' runtimes use to register. HOW=make (the router's host): a random key, made once
# and never shown, created 0600 and filled before the service group may read it, so no one
# reads a partial key. HOW=copy (an engine host of several): the router host's key, which the
# admin copies here; said, never invented (a key of this host's own would be refused).
ensure_secret() {
    local path="$1" mode="$2" owner="$3" how="${4:-make}" d="$DEST$1"
    if [ "$how" = copy ]; then
        if [ -n "$KEY_FROM" ]; then
            install_key "$d" "$mode" "$owner"
            add_entry secret "$path" copied
        elif [ -s "$d" ]; then
            report kept "$d (the router host's key, as copied; replace it with --key-from FILE)"
            if old_info secret "$path" >/dev/null; then add_entry secret "$path" copied; fi
        else
            local from="${KEY_ADDRESS:-ROUTER_HOST}"
            warn "$d is missing: the engines here cannot register with the router without \
the router's control-plane key, made on ${KEY_HOST:-the router host}. Copy it and install \
with it: scp root@$from:$path router.key && sudo $0 --bundle $BUNDLE --key-from router.key \
&& rm router.key"
        fi
        return 0
    fi
    if [ -s "$d" ]; then
        if old_info secret "$path" >/dev/null; then
            report unchanged "$d (the control-plane key)"; add_entry secret "$path" generated
        else
            report kept "$d (yours: never overwritten)"
        fi
        return 0
    fi
    make_parents "$(dirname "$d")"
    run install -m 0600 /dev/null "$d"
    if [ "$DRY" = 1 ]; then
        printf '    would write: 32 random bytes (hex) to %s\n' "$d"
    else
        od -An -vtx1 -N32 /dev/urandom | tr -d ' \n' > "$d"
    fi
    if [ -z "$DEST" ]; then run chown "$owner" "$d"; fi
    run chmod "$mode" "$d"
    report created "$d (a new control-plane key; never printed)"; CHANGED=1
    add_entry secret "$path" generated
}

# What the previous manifest lists and this bundle no longer has (e.g. runtime.libexec_dir or
# runtime.jit_cache changed): remove it if unmodified/empty, else keep it recorded. Accounts,
# env files and parent directories of earlier installs stay recorded.
clean_stale() {
    local e k p i d stale=0 parents=()
    for e in "${OLD[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        [ -z "${NEW_KEYS[$k	$p]:-}" ] || continue
        d="$DEST$p"
        case "$k" in
            user|group|member|enabled) add_entry "$k" "$p" "$i" ;;
            envfile|secret) if [ -e "$d" ]; then add_entry "$k" "$p" "$i"; fi ;;
            parent) parents+=("$e") ;;
            file)
                if [ ! -e "$d" ]; then continue; fi
                if [ "$(sha "$d")" != "$i" ]; then
                    warn "$d is no longer in the bundle but was edited in place: kept"
                    add_entry "$k" "$p" "$i"; continue
                fi
                if [ -z "$DEST" ] && [ "$(dirname "$p")" = "$M_UNIT_DIR" ]; then
                    run systemctl disable --now --quiet "${p##*/}" || true
                    UNITS_CHANGED=1
                fi
                run rm -f "$d"; GONE[$d]=1; stale=1
                report removed "$d (no longer in the bundle)"; CHANGED=1 ;;
            dir)
                [ -d "$d" ] || continue
                stale=1
                if ! remove_dir_if_empty "$d" "no longer in the bundle; --uninstall --purge removes it"; then
                    add_entry "$k" "$p" "$i"
                else
                    CHANGED=1
                fi ;;
        esac
    done
    local sorted=()
    mapfile -t sorted < <(by_depth "${parents[@]}")
    for e in "${sorted[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        [ -d "$DEST$p" ] || continue
        if [ "$stale" = 1 ] && empty_after "$DEST$p"; then
            remove_dir_if_empty "$DEST$p" "not empty" && continue
        fi
        add_entry "$k" "$p" "$i"
    done
}

do_install() {
    local bundle="$1" unit_dir="$2" force="$3" start="$4" entry src dest mode owner path unit d
    local first=1
    CHANGED=0 UNITS_CHANGED=0 NEW_MANIFEST=() CHANGED_UNITS=() KEY_CHANGED=0 BUNDLE="$bundle"
    declare -gA NEW_KEYS=() MADE=() GONE=()
    UNIT_DIR="$unit_dir"
    if old_info enabled "$TARGET" >/dev/null; then first=0; fi
    status "installing $NAME from $bundle$(dry_note)"
    preflight "$bundle" "$unit_dir" "$force"
    INSTALLING=1
    trap on_exit EXIT
    if [ -n "$DEST" ] && [ ! -d "$DEST" ]; then run mkdir -p "$DEST"; fi
    ensure_user
    for entry in "${DIRS[@]}"; do
        IFS=$'\t' read -r path mode owner <<<"$entry"
        ensure_dir "$path" "$mode" "$owner"
    done
    for entry in "${ENVFILES[@]}"; do
        IFS=$'\t' read -r path mode owner <<<"$entry"
        d="$DEST$path"
        if [ -s "$d" ]; then
            report kept "$d (yours: never overwritten)"
        elif [ -e "$d" ]; then
            report unchanged "$d (empty: put secrets such as API keys here)"
        else
            make_parents "$(dirname "$d")"
            run install -m "$mode" /dev/null "$d"
            if [ -z "$DEST" ]; then run chown "$owner" "$d"; fi
            report created "$d (empty: put secrets such as API keys here)"; CHANGED=1
            add_entry envfile "$path" empty
        fi
    done
    for entry in "${SECRETS[@]}"; do
        IFS=$'\t' read -r path mode owner how <<<"$entry"
        ensure_secret "$path" "$mode" "$owner" "$how"
    done
    for unit in "${UNITS[@]}"; do
        FILE_CHANGED=0
        install_file "$bundle/$unit" "$DEST$unit_dir/$unit" 0644
        if [ "$FILE_CHANGED" = 1 ]; then UNITS_CHANGED=1; CHANGED_UNITS+=("$unit"); fi
    done
    for entry in "${FILES[@]}"; do
        IFS=$'\t' read -r src dest mode <<<"$entry"
        install_file "$bundle/$src" "$DEST$dest" "$mode"
    done
    clean_stale
    if [ -n "$DEST" ]; then
        write_manifest "$MANIFEST" "what install.sh created; --uninstall removes it" "${NEW_MANIFEST[@]}"
        INSTALLING=0
        status "staged under DESTDIR=$DEST; the package enables $TARGET (systemctl enable $TARGET)"
        return 0
    fi

    local reload="$UNITS_CHANGED" u
    for u in "${UNITS[@]}"; do
        if [ "$(systemctl show -p NeedDaemonReload --value "$u" 2>/dev/null || true)" = yes ]; then reload=1; fi
    done
    if [ "$reload" = 1 ]; then run systemctl daemon-reload; fi

    local enabled
    enabled="$(systemctl is-enabled "$TARGET" 2>/dev/null || true)"
    case "$enabled" in
        enabled|enabled-runtime|linked|linked-runtime|alias|static|indirect|generated)
            report unchanged "$TARGET $enabled (starts at boot)"
            add_entry enabled "$TARGET" - ;;
        masked|masked-runtime)
            report kept "$TARGET $enabled (yours: systemctl unmask $TARGET to use it)" ;;
        *)
            if [ "$first" = 1 ]; then
                run systemctl enable --quiet "$TARGET"
                report enabled "$TARGET (starts at boot)"; CHANGED=1
                add_entry enabled "$TARGET" -
            else
                report kept "$TARGET ${enabled:-disabled} (your choice: systemctl enable $TARGET to start it at boot)"
            fi ;;
    esac
    write_manifest "$MANIFEST" "what install.sh created; --uninstall removes it" "${NEW_MANIFEST[@]}"
    INSTALLING=0

    if [ "$start" = 1 ]; then
        status "starting $TARGET (returns when the stack serves; follow: journalctl -f -u '$NAME-*')"
        if [ "$DRY" = 1 ]; then run systemctl start "$TARGET"; else start_with_progress || true; fi
    fi
    [ "$CHANGED" = 1 ] || status "nothing changed"
    show_state "${UNITS[@]}"
    [ "$DRY" = 0 ] || return 0

    local inactive=() running_old=()
    for u in "${UNITS[@]}"; do
        if [ "$(systemctl is-active "$u" 2>/dev/null || true)" != active ]; then inactive+=("$u"); fi
    done
    for u in "${CHANGED_UNITS[@]}"; do
        if [ "$(systemctl is-active "$u" 2>/dev/null || true)" = active ]; then running_old+=("$u"); fi
    done
    if [ ${#running_old[@]} -gt 0 ]; then
        status "still running the previous definition: ${running_old[*]}; apply with: systemctl restart $TARGET"
    elif [ "$KEY_CHANGED" = 1 ] && [ ${#inactive[@]} -lt ${#UNITS[@]} ]; then
        status "the engines read the key when they start: systemctl restart $TARGET"
    fi
    if [ "$start" = 1 ] && [ ${#inactive[@]} -gt 0 ]; then
        die "$TARGET was started but ${inactive[*]} not active (see above): systemctl status '$NAME-*'; journalctl -u ${inactive[0]}"
    fi
    if [ ${#inactive[@]} -eq 0 ]; then
        status "$TARGET is active"
    elif [ "$(systemctl is-active "$TARGET" 2>/dev/null || true)" != active ]; then
        status "$TARGET is not started: systemctl start $TARGET (returns when the stack serves), or re-run with --start"
    else
        status "$TARGET is active but not ${inactive[*]}: systemctl status ${inactive[0]}"
    fi
}

# start_with_progress: `systemctl start TARGET`, which returns once the stack serves — with a
# cold JIT cache that can take up to an hour (lifecycle.start_budget_secs). Meanwhile, every
# PDSVC_PROGRESS_SECS (default 15) seconds, one line per service not yet active: the time
# elapsed, its phase (the supervisor's status line, else systemd's state) and the engine's last
# log line. Returns systemctl's exit status.
start_with_progress() {
    local every="${PDSVC_PROGRESS_SECS:-15}" t0="$SECONDS" next pid rc=0 u act phase last
    next=$((t0 + every))
    systemctl start "$TARGET" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if [ "$SECONDS" -lt "$next" ] || ! kill -0 "$pid" 2>/dev/null; then continue; fi
        next=$((SECONDS + every))
        for u in "${UNITS[@]}"; do
            case "$u" in *.service) ;; *) continue ;; esac
            act="$(systemctl show -p ActiveState --value "$u" 2>/dev/null || true)"
            [ "$act" != active ] || continue
            phase="$(systemctl show -p StatusText --value "$u" 2>/dev/null || true)"
            last="$(journalctl -u "$u" -n 1 -o cat --no-pager -q 2>/dev/null | tail -n 1 || true)"
            printf '... %s  %s: %s%s\n' "$(elapsed $((SECONDS - t0)))" "$u" "${phase:-${act:-?}}" \
                "${last:+ | log: ${last:0:160}}"
        done
    done
    wait "$pid" || rc=$?
    status "systemctl start $TARGET returned after $(elapsed $((SECONDS - t0)))"
    return "$rc"
}

# elapsed SECONDS: 42s, 3m05s, 1h02m
elapsed() {
    local s="$1"
    if [ "$s" -lt 60 ]; then printf '%ds' "$s"
    elif [ "$s" -lt 3600 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60))
    else printf '%dh%02dm' $((s / 3600)) $((s % 3600 / 60)); fi
}

# show_state UNIT...: what systemd itself says
show_state() {
    local u load en act
    status "state (from systemd):"
    for u in "$@"; do
        load="$(systemctl show -p LoadState --value "$u" 2>/dev/null || true)"
        en="$(systemctl is-enabled "$u" 2>/dev/null || true)"
        act="$(systemctl is-active "$u" 2>/dev/null || true)"
        printf '  %-28s load=%-10s enabled=%-10s active=%s\n' "$u" "${load:--}" "${en:--}" "${act:--}"
    done
}

# ---------------------------------------------------------------------------- uninstall
do_uninstall() {
    local bundle="$1" purge="$2" force="$3" e k p i d units=() edited=() kept=() deleted_users=()
    declare -gA GONE=() NEW_KEYS=()
    NEW_MANIFEST=()
    [ -f "$MANIFEST" ] || die "no manifest at $MANIFEST: nothing was installed by install.sh for $NAME"
    status "uninstalling $NAME (manifest $MANIFEST)$(dry_note)"

    # Refuse, before changing anything, to delete what was edited in place (unless --force).
    for e in "${OLD[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        [ "$k" = file ] || continue
        d="$DEST$p"
        if [ "$(dirname "$p")" = "$M_UNIT_DIR" ]; then units+=("${p##*/}"); fi
        if [ -f "$d" ] && [ "$(sha "$d")" != "$i" ]; then
            edited+=("$d")
            if [ -f "$bundle/${p##*/}" ] && [ "$(sha "$bundle/${p##*/}")" = "$i" ]; then
                diff -u --label "$d (as installed)" --label "$d (now)" "$bundle/${p##*/}" "$d" >&2 || true
            fi
        fi
    done
    if [ ${#edited[@]} -gt 0 ]; then
        [ "$force" = 1 ] || die "refusing to uninstall: edited in place since install: ${edited[*]}
  Nothing was changed. Move your change to a drop-in, or re-run with --force to delete them."
        warn "--force: deleting what was edited in place: ${edited[*]}"
    fi

    if [ -z "$DEST" ] && [ ${#units[@]} -gt 0 ]; then
        # naming the services makes systemctl wait for their stop jobs (the target stops first)
        run systemctl stop "${units[@]}" || warn "could not stop ${units[*]}"
        run systemctl disable --quiet "${units[@]}" || warn "could not disable ${units[*]}"
    fi
    for e in "${OLD[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        d="$DEST$p"
        case "$k" in
            file)
                if [ ! -e "$d" ]; then report gone "$d"; continue; fi
                run rm -f "$d"; GONE[$d]=1; report removed "$d" ;;
            secret)  # made by install.sh, never the admin's: it goes with the units
                [ -e "$d" ] || continue
                run rm -f "$d"; GONE[$d]=1; report removed "$d" ;;
            envfile)
                [ -e "$d" ] || continue
                if [ "$purge" = 1 ] || [ ! -s "$d" ]; then
                    run rm -f "$d"; GONE[$d]=1; report removed "$d"
                else
                    report kept "$d (not empty: yours; --purge removes it)"; kept+=("$e")
                fi ;;
        esac
    done
    # The manifest goes now, so that its directory does not keep parents alive; what is kept
    # is written back at the end (and everything, should this run fail on the way).
    UNINSTALLING=1
    trap on_exit EXIT
    run rm -f "$MANIFEST"; GONE[$MANIFEST]=1
    if empty_after "$(dirname "$MANIFEST")"; then
        run rmdir "$(dirname "$MANIFEST")"; GONE[$(dirname "$MANIFEST")]=1
    fi
    local dirs=()
    for e in "${OLD[@]}"; do
        case "$e" in dir$'\t'*|parent$'\t'*) dirs+=("$e") ;; esac
    done
    mapfile -t dirs < <(by_depth "${dirs[@]}")
    for e in "${dirs[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        d="$DEST$p"
        [ -d "$d" ] || continue
        if [ "$k" = dir ] && [ "$purge" = 1 ]; then
            run rm -rf "$d"; GONE[$d]=1; report removed "$d/ (and all in it)"
        elif [ "$k" = dir ]; then
            remove_dir_if_empty "$d" "not empty; --purge removes it" || kept+=("$e")
        else
            remove_dir_if_empty "$d" "not empty" || kept+=("$e")
        fi
    done
    # accounts: users before groups (a user's primary group cannot be deleted before it)
    for e in "${OLD[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        [ "$k" = user ] || continue
        if [ "$purge" = 0 ] || [ -n "$DEST" ]; then
            report kept "user $p (owns what is kept; --purge removes it)"; kept+=("$e"); continue
        fi
        if ! getent passwd "$p" >/dev/null; then report gone "user $p"; continue; fi
        run userdel "$p"; deleted_users+=("$p"); report removed "user $p"
    done
    for e in "${OLD[@]}"; do
        IFS=$'\t' read -r k p i <<<"$e"
        case "$k" in
            member)
                if [ "$purge" = 0 ] || [ -n "$DEST" ]; then kept+=("$e"); continue; fi
                case " ${deleted_users[*]} " in *" $p "*) continue ;; esac
                if id -nG "$p" 2>/dev/null | tr ' ' '\n' | grep -qx "$i"; then
                    run gpasswd -d "$p" "$i" >/dev/null; report removed "user $p: - group $i"
                fi ;;
            group)
                if [ "$purge" = 0 ] || [ -n "$DEST" ]; then
                    report kept "group $p (--purge removes it)"; kept+=("$e"); continue
                fi
                if ! getent group "$p" >/dev/null; then report gone "group $p"; continue; fi
                if run groupdel "$p"; then
                    report removed "group $p"
                else
                    warn "could not delete group $p"; kept+=("$e")
                fi ;;
        esac
    done

    if [ ${#kept[@]} -gt 0 ]; then
        write_manifest "$MANIFEST" "what --uninstall kept; --uninstall --purge removes it" "${kept[@]}"
        report kept "$MANIFEST (lists what was kept)"
    else
        report removed "$MANIFEST"
    fi
    UNINSTALLING=0
    if [ -z "$DEST" ] && [ ${#units[@]} -gt 0 ]; then
        run systemctl daemon-reload
        run systemctl reset-failed "${units[@]}" 2>/dev/null || true
        show_state "${units[@]}"
    fi
}

# sourced (tests call its functions): define them only
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
