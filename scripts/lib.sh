# Shared by the scripts: messages and installing Debian packages. Source it; do not run it.

# say_as NAME MESSAGE...: a bold "[mantissa NAME]" line on stderr.
say_as() {
  local who=$1
  shift
  printf '\033[1m[mantissa %s]\033[0m %s\n' "$who" "$*" >&2
}

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# install_debian_packages WHO PACKAGE...: apt-get installs those not installed yet (one
# `apt-get update` first), saying which; does nothing when all are there.
install_debian_packages() {
  local who=$1
  shift
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  say_as "$who" "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# How builds call ccache, as a CMake launcher list: in depend mode, where a first compile runs the
# compiler once (not the preprocessor as well) and ccache reads the includes from its -MD file.
# The cache is ccache's own (~/.cache/ccache; CCACHE_DIR moves it), shared by build/, the
# sanitizer build and the wheel's build.
ccache_launcher="/usr/bin/env;CCACHE_DEPEND=true;ccache"

# format_duration SECONDS: "48s", "3m40s".
format_duration() {
  local s=$1
  if ((s >= 60)); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

# build_with_progress WHO BUILD_DIR: `cmake --build` (ninja, -k 0) with its thousands of
# "[n/N] Building ..." lines condensed into a progress report on stderr: on a terminal one line
# rewritten in place; elsewhere (CI, logs) a line at every tenth of the steps and at least one a
# minute while something is compiling. Everything else the build prints — compiler errors and
# warnings, CMake's messages — passes through whole. Ends with "built in 3m40s", "up to date" or
# "build failed"; returns the build's status.
build_with_progress() {
  local who=$1 build=$2
  NINJA_STATUS='[%f/%t] ' cmake --build "$build" -- -k 0 2>&1 | _ninja_progress "$who"
  return "${PIPESTATUS[0]}"
}

_ninja_progress() {
  local who=$1 tty=0 start=$SECONDS last_print=$SECONDS shown=0
  local done=0 total=0 bucket=-1 pending="" line status nowork=0 failed=0 now pct b
  [[ -t 2 && "${TERM:-dumb}" != dumb ]] && tty=1
  _progress_line() {
    pct=$((total ? 100 * done / total : 0))
    local msg
    msg="building: $done/$total ($pct%), $(format_duration $((SECONDS - start)))"
    if ((tty)); then
      printf '\r\033[K\033[1m[mantissa %s]\033[0m %s' "$who" "$msg" >&2
      shown=1
    else
      say_as "$who" "$msg"
    fi
    last_print=$SECONDS
  }
  while true; do
    # A minute without a finished step (one long nvcc compile) still shows the clock move.
    if IFS= read -r -t 5 line; then
      line=$pending$line
      pending=""
    else
      status=$?
      if ((status > 128)); then  # timed out: keep a partial line for the next read
        pending+=$line
        if ((total && (tty || SECONDS - last_print >= 60))); then _progress_line; fi
        continue
      fi
      [[ -n "$pending$line" ]] || break  # end of input
      line=$pending$line
      pending=""
    fi
    if [[ "$line" =~ ^\[([0-9]+)/([0-9]+)\]\  ]]; then
      done=${BASH_REMATCH[1]}
      if ((BASH_REMATCH[2] != total)); then bucket=-1; fi  # CMake re-ran: a new step count
      total=${BASH_REMATCH[2]}
      ((done > 0)) || continue
      b=$((10 * done / total))
      if ((tty || b > bucket || SECONDS - last_print >= 60)); then
        bucket=$b
        _progress_line
      fi
      continue
    fi
    case "$line" in
      "ninja: no work to do.") nowork=1; continue ;;
      "ninja: build stopped: "*) failed=1 ;;
    esac
    if ((shown)); then printf '\r\033[K' >&2; shown=0; fi
    printf '%s\n' "$line" >&2
  done
  if ((shown)); then printf '\r\033[K' >&2; fi
  now=$(format_duration $((SECONDS - start)))
  if ((failed)); then
    say_as "$who" "build failed after $now ($done of $total steps done); the errors are above"
  elif ((nowork && done == 0)); then
    say_as "$who" "build up to date"
  else
    say_as "$who" "built in $now ($done steps)"
  fi
}
