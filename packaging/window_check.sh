#!/usr/bin/env bash
# Opens the real window on an X server, as a user's desktop does: `hearth` under Xvfb through Qt's
# X11 (xcb) platform plugin, not the offscreen platform the tests use. Waits for the window,
# takes screenshots until one shows it drawn (many distinct colours, not a blank rectangle),
# then quits it with Ctrl+Q and checks that it exits cleanly. .ci/run calls it after installing
# exactly the README's apt packages; by hand, from the root of the clone:
#
#     sudo apt-get install -y xvfb xdotool imagemagick
#     packaging/window_check.sh [HEARTH_COMMAND [SCREENSHOT.png]]
#
# HEARTH_COMMAND defaults to .venv/bin/hearth, SCREENSHOT.png to window.png in the current folder.
set -euo pipefail

hearth=${1:-.venv/bin/hearth}
shot=${2:-window.png}
min_colours=64  # a drawn window shows text, icons and borders in hundreds; a blank one in 1
wait_s=300      # for each stage, on a busy machine: no stage's time is asserted, only that it ends

work=$(mktemp -d)
xvfb_pid="" app_pid=""
cleanup() {
    [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null
    [ -n "$xvfb_pid" ] && kill "$xvfb_pid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "window check: $*" >&2
    if [ -s "$work/app.log" ]; then
        echo "--- hearth's output:" >&2
        tail -n 30 "$work/app.log" >&2
    fi
    exit 1
}
for tool in Xvfb xdotool import identify; do
    command -v "$tool" >/dev/null || fail "$tool is missing (sudo apt-get install -y xvfb xdotool imagemagick)"
done

# an X server of its own on a free display number, which Xvfb writes to fd 3 once it listens
Xvfb -displayfd 3 -screen 0 1280x800x24 -nolisten tcp 3>"$work/display" 2>"$work/xvfb.log" &
xvfb_pid=$!
for _ in $(seq $((wait_s * 10))); do
    [ -s "$work/display" ] && break
    kill -0 "$xvfb_pid" 2>/dev/null || fail "Xvfb did not start: $(cat "$work/xvfb.log")"
    sleep 0.1
done
[ -s "$work/display" ] || fail "Xvfb did not start within $wait_s s"
export DISPLAY=":$(head -n 1 "$work/display")"

# a fresh data folder and settings: the first start a new user sees, on the bundled demo model
env -u QT_QPA_PLATFORM -u WAYLAND_DISPLAY HEARTH_DATA_DIR="$work/data" \
    XDG_CONFIG_HOME="$work/config" HF_HUB_OFFLINE=1 "$hearth" >"$work/app.log" 2>&1 &
app_pid=$!

wid=""
for _ in $(seq $((wait_s * 2))); do
    wid=$(xdotool search --onlyvisible --name '^Hearth' 2>/dev/null | head -n 1 || true)
    [ -n "$wid" ] && break
    kill -0 "$app_pid" 2>/dev/null || { wait "$app_pid" && rc=0 || rc=$?; app_pid="";
                                        fail "hearth exited ($rc) before its window showed"; }
    sleep 0.5
done
[ -n "$wid" ] || fail "no Hearth window within $wait_s s"
echo "+ window $wid shown on $DISPLAY ($(xdotool getwindowgeometry "$wid" | tail -n 1 | xargs))"

colours=0
for _ in $(seq $((wait_s / 2))); do
    import -window "$wid" "$shot"
    colours=$(identify -format '%k' "$shot")
    [ "$colours" -ge "$min_colours" ] && break
    sleep 2
done
[ "$colours" -ge "$min_colours" ] ||
    fail "the window stayed blank: $colours distinct colours in $shot (at least $min_colours wanted)"
echo "+ the window is drawn: $colours distinct colours in $shot"

# quit as a user does: the window takes the keyboard focus, then Ctrl+Q
xdotool windowfocus --sync "$wid"
xdotool key --clearmodifiers ctrl+q
for _ in $(seq $((wait_s * 2))); do
    kill -0 "$app_pid" 2>/dev/null || break
    sleep 0.5
done
kill -0 "$app_pid" 2>/dev/null && fail "hearth did not quit within $wait_s s of Ctrl+Q"
wait "$app_pid" && rc=0 || rc=$?
app_pid=""
[ "$rc" -eq 0 ] || fail "hearth exited $rc after Ctrl+Q"
echo "+ hearth quit cleanly"
