//! Under greedy decoding every drafter must emit exactly the target's own argmax sequence.

use treespec_core::sampling::SamplingParams;
use treespec_engine::drafters::{ChainDrafter, TreeDrafter};
use treespec_engine::toy::{Support, ToyLm, ToyModel};
use treespec_engine::{generate, Drafter, GenerateRequest, PlainDrafter, StopConditions};

fn request(prompt: Vec<u32>, n: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_new_tokens: n,
        sampling: SamplingParams::greedy(),
        seed: 1,
        stop: StopConditions::default(),
    }
}

fn run(
    target: &ToyModel,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    n: usize,
    ctx: usize,
) -> (Vec<u32>, f64) {
    let mut lm = ToyLm::new(target.clone(), ctx);
    let out = generate(&mut lm, drafter, &request(prompt.to_vec(), n), None, &mut |_| true).unwrap();
    (out.tokens, out.stats.mean_accepted())
}

#[test]
fn every_drafter_matches_plain_greedy() {
    for seed in 0..12u64 {
        let vocab = [4, 8, 16, 64][seed as usize % 4];
        let target = ToyModel::new(vocab, 1 + seed as usize % 3, seed);
        let prompt: Vec<u32> = (0..3).map(|i| ((seed + i) % vocab as u64) as u32).collect();
        let (plain, m) = run(&target, &mut PlainDrafter, &prompt, 40, 256);
        assert_eq!(plain.len(), 40);
        assert_eq!(m, 1.0);
        for (noise, support) in
            [(0.0, Support::All), (1.0, Support::All), (3.0, Support::All), (0.0, Support::Odd)]
        {
            let draft = target.draft(noise, seed + 100).with_support(support);
            let mut drafters: Vec<Box<dyn Drafter>> = vec![
                Box::new(ChainDrafter::new(ToyLm::new(draft.clone(), 256), 1).unwrap()),
                Box::new(ChainDrafter::new(ToyLm::new(draft.clone(), 256), 5).unwrap()),
                Box::new(TreeDrafter::new(ToyLm::new(draft.clone(), 256), vec![3, 2, 1]).unwrap()),
                Box::new(TreeDrafter::new(ToyLm::new(draft.clone(), 256), vec![1, 4, 1, 2]).unwrap()),
            ];
            for d in drafters.iter_mut() {
                let (tokens, mean) = run(&target, d.as_mut(), &prompt, 40, 256);
                assert_eq!(tokens, plain, "seed {seed} noise {noise} {:?} drafter {}", support, d.name());
                if noise == 0.0 && support == Support::All {
                    assert!(mean > 1.5, "identical draft should be accepted, mean accepted {mean}");
                }
            }
        }
    }
}

#[test]
fn generation_stops_at_the_context_window() {
    let target = ToyModel::new(8, 1, 3);
    let prompt = vec![1, 2, 3];
    let (plain, _) = run(&target, &mut PlainDrafter, &prompt, 100, 10);
    // 3 prompt positions + 8 emitted tokens, the last never fed: 10 positions.
    assert_eq!(plain.len(), 8);
    let mut chain = ChainDrafter::new(ToyLm::new(target.clone(), 10), 4).unwrap();
    let (spec, _) = run(&target, &mut chain, &prompt, 100, 10);
    assert_eq!(spec, plain);
}

#[test]
fn eos_ends_generation_without_emitting_it() {
    let target = ToyModel::new(8, 1, 3);
    let prompt = vec![1];
    let (plain, _) = run(&target, &mut PlainDrafter, &prompt, 30, 64);
    let eos = plain[5];
    let first = plain.iter().position(|&t| t == eos).unwrap();
    let mut req = request(prompt.clone(), 30);
    req.stop.eos = vec![eos];
    let mut chain = ChainDrafter::new(ToyLm::new(target.clone(), 64), 4).unwrap();
    let out = generate(&mut ToyLm::new(target.clone(), 64), &mut chain, &req, None, &mut |_| true).unwrap();
    assert_eq!(out.tokens, plain[..first].to_vec());
    assert_eq!(out.finish_reason.as_str(), "eos");
    assert!(out.end_token, "the answer ended on a generated end-of-generation token");
    // Cut by the length one token before that token: no end token was generated.
    let mut short = request(prompt, first);
    short.stop.eos = vec![eos];
    let out = generate(&mut ToyLm::new(target.clone(), 64), &mut PlainDrafter, &short, None, &mut |_| true)
        .unwrap();
    assert_eq!((out.tokens.len(), out.finish_reason.as_str(), out.end_token), (first, "length", false));
}
