#!/bin/sh
# Installs the Debian packages Splash builds against, when they are missing.
# Called by `make` once per build directory; safe to run again.
set -e
need=""
check() { # pkg-config name, Debian package
    pkg-config --exists "$1" 2>/dev/null || need="$need $2"
}
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
command -v python3 >/dev/null 2>&1 || need="$need python3"   # tools/make_test_model.py
command -v node >/dev/null 2>&1 || need="$need nodejs npm"   # tests against reference JS and SDKs
[ -x /usr/bin/chromium ] || need="$need chromium"               # the chat page test (headless, playwright-core)
check libpcre2-8 libpcre2-dev
check libutf8proc libutf8proc-dev
check libcrypto libssl-dev
check libmicrohttpd libmicrohttpd-dev
check libcurl libcurl4-openssl-dev
check zlib zlib1g-dev
check cmocka libcmocka-dev
[ -z "$need" ] && exit 0
echo "splash: installing build dependencies:$need"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need
