#!/bin/sh
# Prints the default training corpus, one file per line: the plain fortune-cookie files of the
# Debian packages `fortunes` and `fortunes-min` (/usr/share/games/fortunes/), without the *.dat
# index files, the *.u8 symlinks and the offensive off/ subdirectory. Sorted, so the order (and
# therefore the tokenizer and the shards) is the same everywhere.
# Usage: trillion tokenize --input $(scripts/corpus.sh) --out data/fortunes --vocab-size 8192
set -eu
dir=${1:-/usr/share/games/fortunes}
if [ ! -d "$dir" ]; then
  echo "corpus.sh: $dir not found (install the Debian packages fortunes and fortunes-min)" >&2
  exit 1
fi
find "$dir" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort
