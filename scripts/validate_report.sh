#!/usr/bin/env bash
# scripts/validate.sh's report: from a validation's run directory, the summary (OUT/summary.json:
# "results", the numbers that repeat bit for bit; "speed", those that do not), the must-show checks,
# the curves (gnuplot, pngcairo) and, with DOCS, the section of DOCS/validation.md between its
# "validate.sh" markers and DOCS/k3_mini_pretrain.png, DOCS/k3_mini_finetune.png.
# Usage: bash scripts/validate_report.sh OUT SECONDS [DOCS]
# Exits 1 when a check fails (after writing everything).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1 seconds=$2 docs=${3:-}
plots=$out/plots
mkdir -p "$plots"
pretrain_steps=$(jq '.steps' "$out/pretrain/stages.json")
dense_steps=$(jq '.dense_steps' "$out/pretrain/stages.json")
tail -n 1 "$out/pretrain/eval.txt" > "$out/pretrain_eval.json"
threads=${OMP_NUM_THREADS:-$(nproc)}
# A layer's expert load from its tokens_per_expert arrays ([steps][E]): the busiest expert's
# assignments over the mean's.
load_ratio='transpose | map(add) | max / (add / length)'

# Per-step series (TSV) for the plots and the summary.
# The indexer's selected mass, and the best mass any top-k holds (its ceiling), measure dense
# attention in the dense stage only (both 1 by definition after).
jq -r --argjson dense "$dense_steps" '[.step, .lm_loss, (.val_loss // "NaN"),
        (if .step <= $dense then (.indexer_selected_mass // "NaN"),
           ([.sparse_layers[].best_mass] | if any(. == null) then "NaN" else add / length end)
         else "NaN", "NaN" end), (.indexer_loss // "NaN"), .tokens_per_s] | @tsv' \
  "$out/pretrain/metrics.jsonl" > "$plots/pretrain.tsv"
# Expert load over time: per MoE layer in windows of 50 steps (102k tokens), and the worst layer's
# in each step (2048 tokens).
jq -s -r "[range(0; length; 50) as \$i | .[\$i:\$i + 50] | select(length == 50)] | .[] |
  [.[-1].step] + [range(0; .[0].moe_layers | length) as \$l | [.[].moe_layers[\$l].tokens_per_expert] | $load_ratio]
  | @tsv" "$out/pretrain/metrics.jsonl" > "$plots/expert_load.tsv"
moe_layers=$(head -n 1 "$out/pretrain/metrics.jsonl" | jq -r '[.moe_layers[].layer] | join(" ")')
jq -r '[.step, .expert_load_max_over_mean] | @tsv' "$out/pretrain/metrics.jsonl" > "$plots/expert_load_steps.tsv"
for run in lora lora_ep4 full; do
  jq -r 'select(.val_loss != null) | [.step, .val_loss] | @tsv' "$out/$run/metrics.jsonl" > "$plots/$run.tsv"
done

# The numbers. A run's speed: the median over its steps (the first excluded) of tokens/s and MFU,
# and the largest peak of fast-tier bytes of each rank.
speed() {
  jq -s '.[1:] as $s | ($s | length) as $n |
    {tokens_per_s: ([$s[].tokens_per_s] | sort | .[$n / 2 | floor]),
     mfu: ([$s[].mfu] | sort | .[$n / 2 | floor]),
     mfu_physical_peak: ([$s[].mfu_peak] | sort | .[$n / 2 | floor]),
     rank_peak_bytes: (if $s[0].fsdp then [range(0; $s[0].fsdp.ranks) as $r | [$s[].fsdp.rank_peak_bytes[$r]] | max]
                       else [[$s[].peak_bytes] | max] end),
     seconds: ($s[-1].elapsed_s)}' "$1/metrics.jsonl"
}
half=$((pretrain_steps / 2))
jq -n --slurpfile m "$out/pretrain/metrics.jsonl" \
  --slurpfile pre "$out/pretrain_eval.json" --slurpfile recall "$out/pretrain_recall.json" \
  --slurpfile base "$out/base_eval.json" --slurpfile lora "$out/lora_eval.json" \
  --slurpfile ep4 "$out/lora_ep4_eval.json" --slurpfile full "$out/full_eval.json" \
  --slurpfile info "$out/lora_info.json" \
  --argjson speed_pre "$(speed "$out/pretrain")" --argjson speed_lora "$(speed "$out/lora")" \
  --argjson speed_ep4 "$(speed "$out/lora_ep4")" --argjson speed_full "$(speed "$out/full")" \
  --argjson half "$half" --argjson seconds "$seconds" '
  ($m | map(select(.step > $half))) as $late |
  ($late | map(.expert_load_max_over_mean) | sort) as $late_steps |
  {results: {
     pretrain: {first_loss: $m[0].lm_loss, ln_vocab: (8192 | log), val_loss: $pre[0].val_loss,
                unigram: $pre[0].unigram_baseline_nats, bigram: $pre[0].bigram_baseline_nats,
                indexer_recall: $recall[0].indexer_recall, dense_val_loss: $recall[0].val_loss,
                expert_load_second_half: [range(0; $late[0].moe_layers | length) as $l |
                  {layer: $late[0].moe_layers[$l].layer,
                   max_over_mean: ([$late[].moe_layers[$l].tokens_per_expert] | '"$load_ratio"')}],
                expert_load_second_half_steps: {median: $late_steps[$late_steps | length / 2 | floor],
                                                max: ($late_steps | max)}},
     finetune: {base: $base[0].val_loss, unigram: $base[0].unigram_baseline_nats, bigram: $base[0].bigram_baseline_nats,
                lora: $lora[0].val_loss, lora_ep4: $ep4[0].val_loss, full: $full[0].val_loss,
                trainable: $info[0].trainable_parameters, total: $info[0].parameters_with_adapters}},
   speed: {pretrain: $speed_pre, lora: $speed_lora, lora_ep4: $speed_ep4, full: $speed_full, validate_seconds: $seconds}}
' > "$out/summary.json"

# The must-show checks: "PASS|FAIL<TAB>what<TAB>measured".
jq -r '.results as $r | $r.pretrain as $p | $r.finetune as $f |
  def check(ok; what; measured): [(if ok then "PASS" else "FAIL" end), what, measured] | @tsv;
  def f(x): x * 10000 | round / 10000 | tostring;
  check((($p.first_loss / $p.ln_vocab) - 1 | fabs) <= 0.02; "first loss within 2 % of ln 8192";
        "\(f($p.first_loss)) against \(f($p.ln_vocab))"),
  check($p.val_loss <= 0.9 * $p.bigram; "final validation loss at least 10 % below the bigram baseline";
        "\(f($p.val_loss)) = \(f($p.val_loss / $p.bigram)) × \(f($p.bigram))"),
  check(([$p.indexer_recall[].selected_mass_beyond_topk] | min) >= 0.9;
        "the indexer top-k holds ≥ 90 % of dense attention (queries seeing more keys than top-k)";
        ([$p.indexer_recall[] | "layer \(.layer): \(f(.selected_mass_beyond_topk)) (every query: " +
          "\(f(.selected_mass))); the most any top-k holds: \(f(.best_mass_beyond_topk)) (\(f(.best_mass)))"]
         | join(", "))),
  check(([$p.expert_load_second_half[].max_over_mean] | max) <= 1.5;
        "worst layer expert load max/mean ≤ 1.5 over the second half";
        ([$p.expert_load_second_half[] | "layer \(.layer): \(f(.max_over_mean))"] | join(", ")) +
        " (single steps of 2048 tokens: median \(f($p.expert_load_second_half_steps.median)), most \(f($p.expert_load_second_half_steps.max)))"),
  check($f.lora <= 0.8 * $f.base; "LoRA lowers corpus B validation loss by ≥ 20 %";
        "\(f($f.base)) → \(f($f.lora)) (−\(f(100 * (1 - $f.lora / $f.base))) %)"),
  check($f.trainable <= 0.02 * $f.total; "LoRA trains ≤ 2 % of the parameters";
        "\($f.trainable) of \($f.total) (\(f(100 * $f.trainable / $f.total)) %)"),
  check((($f.lora_ep4 / $f.lora) - 1 | fabs) <= 0.005; "4-rank FSDP + EP 4 LoRA within 0.5 % of one process";
        "\(f($f.lora_ep4)) against \(f($f.lora)) (\(f(100 * ($f.lora_ep4 / $f.lora - 1))) %)")
' "$out/summary.json" > "$out/checks.tsv"

# The curves.
ln_vocab=$(jq '.results.pretrain.ln_vocab' "$out/summary.json")
read -r unigram_a bigram_a < <(jq -r '.results.pretrain | "\(.unigram) \(.bigram)"' "$out/summary.json")
read -r base_b unigram_b bigram_b < <(jq -r '.results.finetune | "\(.base) \(.unigram) \(.bigram)"' "$out/summary.json")
# The final model's recall on corpus A's validation windows, mean over the sparse layers: over every
# query, and over the queries that see more keys than top-k (the check's).
read -r recall_a best_a recall_beyond_a best_beyond_a < <(jq -r '
  def mean: if any(. == null) then "NaN" else add / length end;
  .results.pretrain.indexer_recall | [(map(.selected_mass), map(.best_mass), map(.selected_mass_beyond_topk),
                                       map(.best_mass_beyond_topk)) | mean] | @tsv' "$out/summary.json")
gnuplot <<EOF
set terminal pngcairo size 1200,800 font ",10"
set output "$plots/k3_mini_pretrain.png"
set datafile missing "NaN"
set multiplot layout 2,2 title "k3\\\\_mini pretraining on the fortune cookies ($pretrain_steps steps; attention dense until step $dense_steps, then over the indexer's top-k)"
set grid
set xlabel "step"
set arrow from $dense_steps, graph 0 to $dense_steps, graph 1 nohead dt 2 lc "gray"
set title "loss (nats/token)"
set yrange [3:$ln_vocab + 0.3]
plot "$plots/pretrain.tsv" using 1:2 with lines lw 1 lc "#9ecae1" title "train", \
     "" using 1:3 with linespoints pt 7 lw 2 lc "#08519c" title "validation", \
     $unigram_a with lines dt 3 lc "black" title "unigram baseline", \
     $bigram_a with lines dt 2 lc "red" title "bigram baseline"
set title "expert load, busiest / mean (50-step windows; gray: worst layer per step)"
set yrange [1:*]
plot "$plots/expert_load_steps.tsv" using 1:2 with lines lc "#d9d9d9" notitle, \
     for [l=1:words("$moe_layers")] "$plots/expert_load.tsv" using 1:l + 1 with linespoints lw 2 \
       title "layer ".word("$moe_layers", l), \
     1.5 with lines dt 2 lc "red" title "1.5"
set title "indexer: dense attention's mass on its top-k, and KL (points: the final model)"
set yrange [0:1<*]
set xrange [0:$pretrain_steps * 1.04]
set key center right
plot "$plots/pretrain.tsv" using 1:4 with lines lw 2 lc "#7b3294" title "selected mass", \
     "" using 1:5 with lines lw 1 lc "gray" title "the most any top-k holds", \
     "" using 1:6 with lines lc "#1b9e77" title "KL loss", \
     "+" using ($pretrain_steps):($recall_a) every ::0::0 with points pt 7 ps 1.3 lc "#7b3294" notitle, \
     "+" using ($pretrain_steps):($best_a) every ::0::0 with points pt 6 ps 1.3 lc "gray" notitle, \
     "+" using ($pretrain_steps):($recall_beyond_a) every ::0::0 with points pt 9 ps 1.3 lc "#7b3294" \
       title "triangles: queries seeing more than top-k keys", \
     "+" using ($pretrain_steps):($best_beyond_a) every ::0::0 with points pt 8 ps 1.3 lc "gray" notitle, \
     0.9 with lines dt 2 lc "red" title "0.9 (the check)"
set key default
set xrange [*:*]
set title "throughput (tokens/s, $threads threads)"
set yrange [0:*]
plot "$plots/pretrain.tsv" using 1:7 with lines notitle
unset multiplot
unset arrow
set output "$plots/k3_mini_finetune.png"
set terminal pngcairo size 900,560 font ",10"
set title "fine-tuning on corpus B (computing acronyms), validation loss"
set yrange [*:*]
plot "$plots/lora.tsv" using 1:2 with linespoints pt 7 lw 2 title "LoRA, one process", \
     "$plots/lora_ep4.tsv" using 1:2 with linespoints pt 6 lw 2 dt 2 title "LoRA, 4 ranks (FSDP + EP 4)", \
     "$plots/full.tsv" using 1:2 with linespoints pt 5 lw 1 title "full fine-tuning", \
     $base_b with lines dt 3 lc "black" title "pretrained model", \
     $unigram_b with lines dt 4 lc "gray" title "unigram baseline", \
     $bigram_b with lines dt 2 lc "red" title "bigram baseline"
EOF

# The docs section.
section=$out/validation_section.md
{
  cpu=$(lscpu | sed -n 's/^Model name: *//p')
  family=$(lscpu | sed -n 's/^CPU family: *//p') model=$(lscpu | sed -n 's/^Model: *//p')
  isa=AVX2
  grep -qw avx512f /proc/cpuinfo && isa=AVX-512
  grep -qw avx512_bf16 /proc/cpuinfo && isa="AVX-512 with AVX512-BF16"
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of $cpu (family $family model $model, $isa),"
  echo "OMP_NUM_THREADS=$threads; \`bash scripts/validate.sh\` took $seconds s."
  echo
  echo "| check | | measured |"
  echo "|---|---|---|"
  awk -F'\t' '{printf "| %s | %s | %s |\n", $2, $1, $3}' "$out/checks.tsv"
  echo
  echo "| run | validation loss | unigram | bigram | tokens/s | MFU (GEMM, physical) | peak bytes per rank | seconds |"
  echo "|---|---|---|---|---|---|---|---|"
  jq -r '.results as $r | .speed as $s |
    def f(x): x * 10000 | round / 10000 | tostring;
    def mb(x): [x[] | (. / 1e6 | round | tostring) + " MB"] | join(", ");
    def row(name; loss; u; b; s): "| \(name) | \(f(loss)) | \(f(u)) | \(f(b)) | \(s.tokens_per_s | round) | \(f(s.mfu)), \(f(s.mfu_physical_peak)) | \(mb(s.rank_peak_bytes)) | \(s.seconds | round) |";
    row("(a) pretraining, corpus A"; $r.pretrain.val_loss; $r.pretrain.unigram; $r.pretrain.bigram; $s.pretrain),
    "| pretrained model on corpus B | \(f($r.finetune.base)) | \(f($r.finetune.unigram)) | \(f($r.finetune.bigram)) | | | | |",
    row("(b) LoRA, one process"; $r.finetune.lora; $r.finetune.unigram; $r.finetune.bigram; $s.lora),
    row("(b) LoRA, 4 ranks, FSDP + EP 4"; $r.finetune.lora_ep4; $r.finetune.unigram; $r.finetune.bigram; $s.lora_ep4),
    row("(c) full fine-tuning"; $r.finetune.full; $r.finetune.unigram; $r.finetune.bigram; $s.full)' "$out/summary.json"
  echo
  echo "![k3_mini pretraining](k3_mini_pretrain.png)"
  echo
  echo "![k3_mini fine-tuning](k3_mini_finetune.png)"
  echo
  echo "The pretrained model's sample (\`generate --prompt \"The meaning of life is\" --temperature 0.8 --top-p 0.95 --seed 1\`):"
  echo
  echo '```'
  cat "$out/pretrain/sample.txt"
  echo '```'
  echo
  echo "After LoRA, greedy from \"CPU:\":"
  echo
  echo '```'
  cat "$out/lora_sample.txt"
  echo '```'
  echo
  echo "The last checkpoints' SHA-256 (OUT/hashes.txt):"
  echo
  echo '```'
  cat "$out/hashes.txt"
  echo '```'
} > "$section"

if [ -n "$docs" ]; then
  for marker in begin end; do
    [ "$(grep -c "^<!-- validate.sh: $marker -->\$" "$docs/validation.md")" -eq 1 ] ||
      { echo "validate_report.sh: $docs/validation.md needs one line '<!-- validate.sh: $marker -->'" >&2; exit 1; }
  done
  cp "$plots/k3_mini_pretrain.png" "$plots/k3_mini_finetune.png" "$docs/"
  awk -v section="$section" '
    /^<!-- validate.sh: begin -->$/ { print; while ((getline line < section) > 0) print line; skipping = 1; next }
    /^<!-- validate.sh: end -->$/ { skipping = 0 }
    !skipping' "$docs/validation.md" > "$docs/validation.md.new"
  mv "$docs/validation.md.new" "$docs/validation.md"
fi
cat "$section"
! grep -q '^FAIL' "$out/checks.tsv"
