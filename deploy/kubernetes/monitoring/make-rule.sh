#!/usr/bin/env bash
# Writes prometheusrule.yaml from deploy/monitoring/alerts.yml: the same
# groups, as a PrometheusRule. Run it after changing the alerts; the deploy
# test checks that the two agree.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
{
  echo "# Made by make-rule.sh from deploy/monitoring/alerts.yml: change that, then run it."
  echo "apiVersion: monitoring.coreos.com/v1"
  echo "kind: PrometheusRule"
  echo "metadata:"
  echo "  name: hourglass"
  echo "spec:"
  grep -v '^#' "$here/../../monitoring/alerts.yml" | sed 's/^\(.\)/  \1/'
} >"$here/prometheusrule.yaml"
