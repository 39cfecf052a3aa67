#!/bin/sh
# mkman.sh CKPT OUT — builds the ckpt(1) man page from the binary's own --help
# texts, so the page covers every command and never drifts from them.
# printf, not echo: dash's echo turns "\f" of a font change into a form feed.
set -eu
bin=$1; out=$2
{
  printf '%s\n' '.TH CKPT 1 "" "ckpt" "User Commands"'
  printf '%s\n' '.SH NAME'
  printf '%s\n' 'ckpt \- convert, store and serve model checkpoints'
  printf '%s\n' '.SH SYNOPSIS'
  printf '%s\n' '.B ckpt'
  printf '%s\n' '[\fB\-\-home\fR \fIDIR\fR | \fB\-\-server\fR \fIURL\fR] \fICOMMAND\fR [\fIOPTIONS\fR]'
  printf '%s\n' '.SH DESCRIPTION'
  printf '%s\n' '.nf'
  "$bin" --help | sed 's/\\/\\\\/g; s/^\([.'"'"']\)/\\\&\1/'
  printf '%s\n' '.fi'
  for cmd in $("$bin" --help | awk '/^commands:/{on=1;next} on && /^$/{exit} on && /^  [a-z]/{print $1}'); do
    printf '.SH "ckpt %s"\n' "$cmd"
    printf '%s\n' '.nf'
    "$bin" "$cmd" --help | sed 's/\\/\\\\/g; s/^\([.'"'"']\)/\\\&\1/'
    printf '%s\n' '.fi'
  done
} > "$out.tmp"
mv "$out.tmp" "$out"
