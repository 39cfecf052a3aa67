# bash completion for ckpt: commands, their options and stored refs.
# Everything is read from the binary itself (`ckpt --help`, `ckpt CMD --help`,
# `ckpt ls`), so it follows the installed version and the store (or the
# server: CKPT_SERVER, the config file) it would work on.
# Installed by `make install` into share/bash-completion/completions/ckpt;
# by hand: . deploy/completion/ckpt.bash
_ckpt() {
    local cur prev cmd i
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD - 1]}
    cmd=
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
        --home | --server | --token-file) ((i++)) ;;
        -*) ;;
        *) cmd=${COMP_WORDS[i]}; break ;;
        esac
    done
    case $prev in
    --home | -o | --output | --token-file | --rules | --lora | --allow-path | --until-file)
        COMPREPLY=($(compgen -f -- "$cur"))
        return ;;
    --layout)
        COMPREPLY=($(compgen -W "neuron fused easydel hf vllm" -- "$cur"))
        return ;;
    --dtype)
        COMPREPLY=($(compgen -W "bf16 f16 f32" -- "$cur"))
        return ;;
    --state)
        COMPREPLY=($(compgen -W "queued running succeeded failed cancelled" -- "$cur"))
        return ;;
    --log-format)
        COMPREPLY=($(compgen -W "text json" -- "$cur"))
        return ;;
    --log-level)
        COMPREPLY=($(compgen -W "error warn info debug" -- "$cur"))
        return ;;
    esac
    if [ -z "$cmd" ]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "--home --server --token-file --help --version" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$(ckpt --help 2>/dev/null | awk '/^commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{on=0}')" -- "$cur"))
        fi
        return
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(ckpt "$cmd" --help 2>/dev/null | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)" -- "$cur"))
        return
    fi
    case $cmd in
    show | rm | pull | convert | verify | ls)
        # refs of the store (ckpt ls prints one per line, the ref first); folders for convert SRC
        COMPREPLY=($(compgen -W "$(ckpt ls 2>/dev/null | awk '{print $1}')" -- "$cur"))
        [ "$cmd" = convert ] && COMPREPLY+=($(compgen -d -- "$cur"))
        ;;
    sync | state)
        COMPREPLY=($(compgen -W "$(ckpt "$cmd" --help 2>/dev/null | awk '/usage:/{on=1} on && /ckpt '"$cmd"' [a-z]/{for (i = 1; i <= NF; i++) if ($i == "'"$cmd"'") print $(i + 1)}' | sort -u)" -- "$cur"))
        ;;
    *)
        COMPREPLY=($(compgen -f -- "$cur"))
        ;;
    esac
}
complete -F _ckpt ckpt
