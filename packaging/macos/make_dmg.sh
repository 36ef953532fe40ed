#!/usr/bin/env bash
# Wraps dist/Inference Studio.app (from `python packaging/build.py --bundle-only` on macOS) in a compressed .dmg
# with an /Applications link to drag it onto. Runs on macOS only (hdiutil); CI: .github/workflows/installers.yml.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-.venv/bin/python}
VERSION=$("$PYTHON" -c 'from app.version import __version__; print(__version__)')
APP="dist/Inference Studio.app"
DMG="dist/inference-studio-${VERSION}-macos-$(uname -m).dmg"

if [[ ! -d "$APP" ]]; then
    echo "make_dmg: $APP is missing; run: $PYTHON packaging/build.py --bundle-only" >&2
    exit 2
fi
# PyInstaller signs ad hoc; check the signature holds before shipping it (a Developer ID signature and
# notarization would replace this: codesign --deep --options runtime --sign "Developer ID Application: ...").
codesign --verify --deep --strict "$APP"

STAGING=$(mktemp -d)
trap 'rm -rf "$STAGING"' EXIT
cp -R "$APP" "$STAGING/"
ln -s /Applications "$STAGING/Applications"
rm -f "$DMG"
hdiutil create -volname "Inference Studio ${VERSION}" -srcfolder "$STAGING" -fs HFS+ -format UDZO \
    -imagekey zlib-level=9 -ov "$DMG"
hdiutil verify "$DMG"
echo "make_dmg: $DMG ($(du -h "$DMG" | cut -f1))"
