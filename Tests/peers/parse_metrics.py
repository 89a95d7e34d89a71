#!/usr/bin/env python3
"""Parses Prometheus text from stdin with the official client library's parser and prints one
JSON object: {"name{label=value,...}": value}, labels sorted. A parse error exits 1."""
import json, sys

from prometheus_client.parser import text_string_to_metric_families

samples = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        labels = ",".join(f"{key}={value}" for key, value in sorted(sample.labels.items()))
        samples[f"{sample.name}{{{labels}}}"] = sample.value
json.dump(samples, sys.stdout)
