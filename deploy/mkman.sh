#!/bin/sh
# mkman.sh CKPT OUT — builds the ckpt(1) man page from the binary's own --help
# texts, so the page covers every command and never drifts from them.
set -eu
bin=$1; out=$2
{
  echo '.TH CKPT 1 "" "ckpt" "User Commands"'
  echo '.SH NAME'
  echo 'ckpt \- convert, store and serve model checkpoints'
  echo '.SH SYNOPSIS'
  echo '.B ckpt'
  echo '\fICOMMAND\fR [\fIOPTIONS\fR]'
  echo '.SH DESCRIPTION'
  echo '.nf'
  "$bin" --help | sed 's/\\/\\\\/g; s/^\./\\\&./'
  echo '.fi'
  for cmd in $("$bin" --help | awk '/^commands:/{on=1;next} on && /^  [a-z]/{print $1}'); do
    echo ".SH \"ckpt $cmd\""
    echo '.nf'
    "$bin" "$cmd" --help | sed 's/\\/\\\\/g; s/^\./\\\&./'
    echo '.fi'
  done
} > "$out.tmp"
mv "$out.tmp" "$out"
