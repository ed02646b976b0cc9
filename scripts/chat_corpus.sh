#!/usr/bin/env bash
# Prints a corpus of ChatML conversations (docs/data.md's {"messages": [...]} JSONL, one per line)
# made from Debian's dict-vera package, V.E.R.A., the Virtual Entity of Relevant Acronyms: for each
# of its ~13,000 entries the user asks "What does ACRONYM stand for?" and the assistant answers with
# the entry's expansion as the dictionary states it (notes in parentheses kept). Another domain
# than the fortune cookies, for LoRA fine-tuning a model pretrained on them (docs/validation.md).
# With --text, the same entries as plain text instead, a paragraph each ("3GL: 3rd Generation
# Language"), for fine-tuning on every token (scripts/validate.sh's corpus B).
# Usage: bash scripts/chat_corpus.sh [--text] > vera.jsonl   (scripts/setup.sh installs dict-vera)
set -euo pipefail
format=conversations
if [ "${1:-}" = "--text" ]; then
  format=text
  shift
fi
dir=${1:-/usr/share/dictd}
if [ ! -f "$dir/vera.index" ] || [ ! -f "$dir/vera.dict.dz" ]; then
  echo "chat_corpus.sh: $dir/vera.index or vera.dict.dz not found (install the Debian package dict-vera)" >&2
  exit 1
fi
# The dictionary is blocks separated by lines of blanks: a headword line, then its definition's lines.
# A block is an entry when its first line is a headword of the index, which stores them in lower
# case without other characters than letters, digits and blanks (the header's blocks are not).
zcat "$dir/vera.dict.dz" | LC_ALL=C awk -F'\t' -v format="$format" '
  function json(s) {
    gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, " ", s)
    return "\"" s "\""
  }
  function key(s) { s = tolower(s); gsub(/[^a-z0-9 ]/, "", s); return s }
  function flush() {
    if (head != "" && (key(head) in headwords) && body != "") {
      if (format == "text")
        print head ": " body "\n"
      else
        print "{\"messages\": [{\"role\": \"user\", \"content\": " json("What does " head " stand for?") \
              "}, {\"role\": \"assistant\", \"content\": " json(body) "}]}"
    }
    head = ""; body = ""
  }
  FNR == NR { if ($1 !~ /^00-?database/) headwords[$1] = 1; next }
  /^[ \t]*$/ { flush(); next }
  head == "" { head = $0; next }
  { line = $0; sub(/^[ \t]+/, "", line); body = body (body == "" ? "" : " ") line }
  END { flush() }
' "$dir/vera.index" -
