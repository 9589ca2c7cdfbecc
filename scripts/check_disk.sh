#!/usr/bin/env bash
# Refuse to start a venv install that cannot fit: scripts/check_disk.sh VENV_DIR NEEDED_MB
# NEEDED_MB is the installed venv's size plus room for pip's unpacking; what VENV_DIR already holds counts towards it
# (a rerun after a failed install needs less). pip's temporary folder (TMPDIR), where it is another filesystem, needs
# room for the largest wheel it unpacks (TMP_MB, 1,500 MB). Exits 1, saying what is missing and how to finish, when
# there is less free space than that.
set -euo pipefail
V=$1
NEED_MB=$2
TMP_MB=${CHECK_DISK_TMP_MB:-1500}
free_mb() { echo $(( $(df -Pk "$1" | awk 'NR==2 {print $4}') / 1024 )); }
fs_of() { df -P "$1" | awk 'NR==2 {print $1}'; }
have_mb=0
if [ -d "$V" ]; then have_mb=$(( $(du -sk "$V" | cut -f1) / 1024 )); fi
parent=$(dirname "$(realpath -m "$V")")
tmp=${TMPDIR:-/tmp}
want=$(( NEED_MB - have_mb ))
if [ -d "$tmp" ] && [ "$(fs_of "$tmp")" != "$(fs_of "$parent")" ] && [ "$(free_mb "$tmp")" -lt "$TMP_MB" ]; then
  echo "error: installing $V needs about $TMP_MB MB free in pip's temporary folder $tmp; it has $(free_mb "$tmp") MB." >&2
  echo "Free space there or set TMPDIR to a roomier folder, then rerun the same make command (it resumes the install)." >&2
  exit 1
fi
if [ "$(free_mb "$parent")" -lt "$want" ]; then
  echo "error: installing $V needs about $want MB more free space on the filesystem of $parent; it has $(free_mb "$parent") MB." >&2
  echo "Free space there, then rerun the same make command (it resumes the install)." >&2
  exit 1
fi
