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
