#!/usr/bin/env bash
# A/B cold: old vs new auto, each on its own curves-only cache (the curve each build refines stays its own), plain beside.
cd /work/main
source scripts/lib/cold-cache.sh
curves_only_cache /tmp/ab/cacheA
curves_only_cache /tmp/ab/cacheB
curves_only_cache /tmp/ab/cacheP
T=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
D=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
P=bench/results/cold-qwen-zen3-eos/held-out.jsonl
: > /tmp/ab/runs.jsonl
i=0
for pass in 1 2; do
while IFS= read -r line; do
  i=$((i+1))
  id="$(jq -r '.question_id // .id' <<<"$line")"; cat="$(jq -r '.category' <<<"$line")"; text="$(jq -r '.turns[0]' <<<"$line")"
  name="${id//\//_}"
  tools=(plain old new); k=$((i%3)); tools=("${tools[@]:$k}" "${tools[@]:0:$k}")
  for tool in "${tools[@]}"; do
    case $tool in
      plain) out=$(cold_generate /tmp/ab/cacheP /tmp/treespec-new -m $T -t 2 --method plain --chat -n 128 --json -p "$text");;
      old) out=$(cold_generate /tmp/ab/cacheA /tmp/treespec-old -m $T -t 2 --method auto --chat -n 128 --json --draft $D --decision-trace /tmp/ab/old-$name-$pass.trace -p "$text");;
      new) out=$(cold_generate /tmp/ab/cacheB /tmp/treespec-new -m $T -t 2 --method auto --chat -n 128 --json --draft $D --decision-trace /tmp/ab/new-$name-$pass.trace -p "$text");;
    esac
    jq -c --arg id "$id" --arg c "$cat" --arg t "$tool" --argjson p $pass '{id:$id,category:$c,tool:$t,pass:$p,tps:.stats.tokens_per_s,n:.stats.new_tokens,fw:.stats.target_forwards}' <<<"$out" >> /tmp/ab/runs.jsonl
  done
  echo "$pass $i $cat $id $(cut -d' ' -f1 /proc/loadavg)" >> /tmp/ab/progress
done < $P
done
echo done >> /tmp/ab/progress
