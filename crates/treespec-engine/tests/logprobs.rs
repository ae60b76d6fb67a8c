//! Log-probabilities of emitted tokens come from the target's distribution at each emitted
//! position, whatever the draft: speculative decoding reports exactly what plain decoding
//! reports (greedy: the same tokens, the same numbers), and they match the toy target's exact
//! conditionals.

use treespec_core::sampling::{Sampler, SamplingParams};
use treespec_core::TokenId;
use treespec_engine::drafters::ChainDrafter;
use treespec_engine::toy::{ToyLm, ToyModel};
use treespec_engine::CausalLm;
use treespec_engine::{
    Drafter, ForwardCost, GenerateRequest, Generation, PlainDrafter, ProposeAt, Scored, TokenLogprob,
    TreeBatch,
};

fn run(drafter: &mut dyn Drafter, sampling: SamplingParams) -> (Vec<TokenId>, Vec<TokenLogprob>) {
    let model = ToyModel::new(7, 2, 5);
    let mut target = ToyLm::new(model, 64);
    let request = GenerateRequest::new(vec![1, 4, 2], 12, sampling, 11);
    let mut g = Generation::new(request, 64, 7, None).unwrap().with_logprobs(3);
    target.prefill(g.prompt_head()).unwrap();
    g.begin(drafter, Default::default()).unwrap();
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while let Some(tree) = g.propose(drafter, None, ProposeAt::alone(target.committed_len())).unwrap() {
        let batch = TreeBatch::from_tree(tree, 0);
        let logits = target.forward(&batch).unwrap().into_owned();
        let scored = Scored {
            logits: &logits,
            forward: ForwardCost {
                rows: batch.len(),
                prompt_rows: 0,
                time: Default::default(),
                graph_reused: None,
            },
        };
        let step = g.complete(drafter, None, scored, None).unwrap();
        target.commit(&step.path).unwrap();
        assert_eq!(step.logprobs.len(), step.emitted.len());
        tokens.extend(step.emitted);
        logprobs.extend(step.logprobs);
        if step.done {
            break;
        }
    }
    (tokens, logprobs)
}

#[test]
fn speculative_logprobs_equal_plain_logprobs() {
    let draft = ToyModel::new(7, 2, 5).draft(0.3, 9);
    let (plain_tokens, plain) = run(&mut PlainDrafter, SamplingParams::greedy());
    let mut chain = ChainDrafter::new(ToyLm::new(draft, 64), 4).unwrap();
    let (tokens, spec) = run(&mut chain, SamplingParams::greedy());
    assert_eq!(tokens, plain_tokens);
    assert_eq!(spec, plain);
    assert_eq!(plain.len(), 12);
    for l in &plain {
        // Greedy: the emitted token is the most likely one; alternatives are sorted.
        assert_eq!(l.top[0], (l.token, l.logprob));
        assert!(l.top.windows(2).all(|w| w[0].1 >= w[1].1), "{l:?}");
        assert_eq!(l.top.len(), 3);
    }
}

#[test]
fn sampled_logprobs_are_the_targets_conditionals() {
    let model = ToyModel::new(7, 2, 5);
    let sampling = SamplingParams::with_temperature(0.8);
    let sampler = Sampler::new(sampling.clone()).unwrap();
    let draft = model.draft(0.3, 9);
    let mut chain = ChainDrafter::new(ToyLm::new(draft, 64), 3).unwrap();
    let (tokens, logprobs) = run(&mut chain, sampling);
    let mut history = vec![1, 4, 2];
    for (t, l) in tokens.iter().zip(&logprobs) {
        let want = sampler.distribution(&model.logits(&history), &[]).unwrap().prob(*t).ln();
        assert!((l.logprob - want).abs() < 1e-5, "token {t}: {} vs {want}", l.logprob);
        history.push(*t);
    }
}
