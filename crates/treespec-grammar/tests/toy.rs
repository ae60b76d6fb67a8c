//! Constraint behaviour on toy vocabularies: masks, random walks, forced tokens, rollback, EOS.

mod common;

use common::{byte_vocab, random_walk, toy_vocab};
use serde_json::{json, Value};
use treespec_grammar::{Constraint, GrammarSpec, TokenId, Vocabulary};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

fn constraint(vocab: &Vocabulary, spec: GrammarSpec) -> Constraint {
    spec.compile(vocab).unwrap().constraint()
}

/// Check a document against [`schema`] by hand.
fn check_doc(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    assert!(keys.len() >= 2 && keys[0] == "name" && keys[1] == "age", "keys {keys:?}: {text}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 8, "{text}");
    assert!(o["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
    for (k, v) in o {
        match k.as_str() {
            "name" | "age" => {}
            "tags" => {
                let tags = v.as_array().unwrap();
                assert!(
                    tags.len() <= 3 && tags.iter().all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap())),
                    "{text}"
                );
            }
            "ok" => assert!(v.is_boolean(), "{text}"),
            other => panic!("extra key {other}: {text}"),
        }
    }
}

#[test]
fn random_walks_give_schema_valid_json() {
    for (vocab, eos) in [toy_vocab(), byte_vocab()] {
        let grammar = GrammarSpec::JsonSchema(schema()).compile(&vocab).unwrap();
        for seed in 0..40 {
            let mut c = grammar.constraint();
            let path = random_walk(&mut c, seed, 400);
            assert_eq!(path.last(), Some(&eos));
            assert!(path[..path.len() - 1].iter().all(|&t| t != eos));
            check_doc(&vocab.decode(&path));
        }
    }
}

fn allowed_bytes(c: &mut Constraint) -> Vec<u8> {
    c.mask().unwrap().iter().filter(|&t| t < 256).map(|t| t as u8).collect()
}

#[test]
fn masks_allow_only_valid_continuations() {
    let (vocab, eos) = byte_vocab();
    let mut c = constraint(&vocab, GrammarSpec::JsonSchema(schema()));
    // The start is fixed up to the name's value: `{"name": "`.
    assert_eq!(c.forced_tokens(100).unwrap(), b"{\"name\": \"".map(u32::from).to_vec());
    c.advance_all(&b"{\"name\": \"".map(u32::from)).unwrap();
    // Inside the string: printable text and the closing quote, no raw newline, no EOS.
    let inside = allowed_bytes(&mut c);
    assert!(inside.contains(&b'x') && inside.contains(&b'"') && inside.contains(&b'\\'));
    assert!(!inside.contains(&b'\n') && !c.is_allowed(eos).unwrap());
    c.advance_all(&b"Al\", \"age\": ".map(u32::from)).unwrap();
    // An integer in 0..=150: digits only, no sign, no quote.
    let digits = allowed_bytes(&mut c);
    assert_eq!(digits, (b'0'..=b'9').collect::<Vec<u8>>());
    c.advance_all(b"15".map(u32::from).as_slice()).unwrap();
    // 15 may go on to 150 only; `}` or `,` may end it.
    let after = allowed_bytes(&mut c);
    assert_eq!(after, b",0}".to_vec(), "after 15: {:?}", String::from_utf8_lossy(&after));
    assert!(matches!(
        c.advance(u32::from(b'7')),
        Err(treespec_grammar::GrammarError::Rejected { token: 55 })
    ));
    c.advance(u32::from(b'}')).unwrap();
    // The document is complete: only EOS.
    assert!(c.is_stopped() && c.is_accepting());
    assert_eq!(c.mask().unwrap().iter().collect::<Vec<_>>(), vec![eos]);
}

#[test]
fn multi_byte_tokens_follow_the_forced_tokenization() {
    let (vocab, _) = toy_vocab();
    let mut c = constraint(&vocab, GrammarSpec::JsonSchema(schema()));
    // Greedy longest match of the fixed `{"name": "`: `{"`, `name`, `": "` (or a prefix of it).
    let forced = c.forced_tokens(100).unwrap();
    let text = vocab.decode(&forced);
    assert!(text.starts_with("{\"name") && "{\"name\": \"".starts_with(&text), "forced {text:?}");
    assert_eq!(forced[0], 256); // `{"`
                                // At a forced position the mask is that one token: `{` alone is not allowed.
    assert_eq!(c.mask().unwrap().single(), Some(256));
    assert!(!c.is_allowed(u32::from(b'{')).unwrap());
    // The byte-level pre-check is wider than the mask there.
    assert!(c.could_follow(256));

    // Without forcing, both tokenizations are allowed and nothing is forced.
    let free = vocab.without_forcing().unwrap();
    let mut c = constraint(&free, GrammarSpec::JsonSchema(schema()));
    assert!(c.is_allowed(256).unwrap() && c.is_allowed(u32::from(b'{')).unwrap());
    assert!(!c.is_allowed(u32::from(b'[')).unwrap());
    assert_eq!(c.forced_tokens(100).unwrap(), Vec::<TokenId>::new());
}

#[test]
fn forced_tokens_are_masks_with_one_token_and_leave_the_state_alone() {
    let (vocab, _) = toy_vocab();
    let grammar = GrammarSpec::JsonSchema(schema()).compile(&vocab).unwrap();
    for seed in 0..10 {
        let path = random_walk(&mut grammar.constraint(), seed, 400);
        let mut c = grammar.constraint();
        for &t in &path {
            let before: Vec<u32> = c.mask().unwrap().as_words().to_vec();
            let forced = c.forced_tokens(64).unwrap();
            assert_eq!(c.mask().unwrap().as_words(), before.as_slice());
            let mut probe = c.fork();
            for &f in &forced {
                assert_eq!(probe.mask().unwrap().single(), Some(f));
                probe.advance(f).unwrap();
            }
            // The chain stops where the mask opens up (or at the cap, or after EOS).
            assert!(forced.len() == 64 || probe.is_finished() || probe.mask().unwrap().single().is_none());
            c.advance(t).unwrap();
        }
    }
}

#[test]
fn rollback_restores_the_exact_mask() {
    let (vocab, _) = toy_vocab();
    let grammar = GrammarSpec::JsonSchema(schema()).compile(&vocab).unwrap();
    for seed in 0..10 {
        let path = random_walk(&mut grammar.constraint(), 100 + seed, 400);
        let mut c = grammar.constraint();
        let mut masks = Vec::new();
        for &t in &path {
            masks.push(c.mask().unwrap().as_words().to_vec());
            c.advance(t).unwrap();
        }
        assert!(c.is_finished() && c.mask().unwrap().count() == 0);
        // Step back one token at a time, then jump back and replay from the middle.
        for i in (0..path.len()).rev() {
            c.rollback(1).unwrap();
            assert_eq!(c.len(), i);
            assert_eq!(c.mask().unwrap().as_words(), masks[i].as_slice(), "seed {seed} pos {i}");
        }
        let mid = path.len() / 2;
        c.advance_all(&path).unwrap();
        c.rollback(path.len() - mid).unwrap();
        assert_eq!(c.mask().unwrap().as_words(), masks[mid].as_slice());
        c.advance_all(&path[mid..]).unwrap();
        assert!(c.is_finished());
        assert!(c.rollback(path.len() + 1).is_err());
    }
}

#[test]
fn eos_is_allowed_exactly_where_the_grammar_can_end() {
    let (vocab, eos) = byte_vocab();
    let a = u32::from(b'a');
    let mut c = constraint(&vocab, GrammarSpec::Regex("a+".into()));
    assert!(!c.is_accepting() && !c.is_allowed(eos).unwrap());
    c.advance(a).unwrap();
    // `a+` can end or go on: both allowed; EOS is taken by llguidance itself.
    assert!(c.is_accepting() && !c.is_stopped());
    assert_eq!(c.mask().unwrap().iter().collect::<Vec<_>>(), vec![a, eos]);
    c.advance(eos).unwrap();
    assert!(c.is_finished() && c.mask().unwrap().count() == 0);
    assert!(matches!(c.advance(a), Err(treespec_grammar::GrammarError::Rejected { .. })));
    c.rollback(1).unwrap();
    assert_eq!(c.mask().unwrap().iter().collect::<Vec<_>>(), vec![a, eos]);

    // `ab` must end after `b`: the parser stops, EOS is the only token and is held here.
    let mut c = constraint(&vocab, GrammarSpec::Regex("ab".into()));
    c.advance_all(&[a, u32::from(b'b')]).unwrap();
    assert!(c.is_stopped() && c.is_accepting() && c.forced_tokens(8).unwrap() == vec![eos]);
    c.advance(eos).unwrap();
    assert!(c.is_finished() && !c.is_accepting());
    c.rollback(2).unwrap();
    assert_eq!(c.mask().unwrap().single(), Some(u32::from(b'b')));
}

#[test]
fn every_eos_id_ends_and_special_tokens_never_match_text() {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    tokens.push(b"<|end|>".to_vec()); // 256: EOS
    tokens.push(b"<|eot|>".to_vec()); // 257: EOS too
    tokens.push(b"<|im_start|>".to_vec()); // 258: special, not EOS
    let vocab = Vocabulary::new(&tokens, &[256, 257], &[258]).unwrap();
    // A grammar whose text is exactly a special token's name still never allows the token.
    let mut c = constraint(&vocab, GrammarSpec::Regex("<\\|im_start\\|>x?".into()));
    let forced = c.forced_tokens(100).unwrap();
    assert_eq!(vocab.decode(&forced), "<|im_start|>");
    assert!(forced.iter().all(|&t| t < 256));
    c.advance_all(&forced).unwrap();
    assert_eq!(c.mask().unwrap().iter().collect::<Vec<_>>(), vec![u32::from(b'x'), 256, 257]);
    c.advance(257).unwrap();
    assert!(c.is_finished());
}

#[test]
fn lark_grammars_constrain_too() {
    let (vocab, eos) = byte_vocab();
    let lark = "start: \"yes\" | \"no\" | \"maybe \" NUM\nNUM: /[0-9]{1,2}/\n";
    let mut c = constraint(&vocab, GrammarSpec::Lark(lark.into()));
    assert_eq!(allowed_bytes(&mut c), b"mny".to_vec());
    c.advance_all(&b"maybe 4".map(u32::from)).unwrap();
    assert_eq!(c.mask().unwrap().count(), 11); // a second digit or EOS
    assert!(c.is_allowed(eos).unwrap());
}

#[test]
fn json_object_allows_any_object_only() {
    let (vocab, _) = byte_vocab();
    let grammar = GrammarSpec::JsonObject.compile(&vocab).unwrap();
    let mut c = grammar.constraint();
    assert_eq!(allowed_bytes(&mut c), b"{".to_vec());
    c.advance_all(&br#"{"x": [1, {"y": null}], "z": "w"}"#.map(u32::from)).unwrap();
    assert!(c.is_stopped());
}

#[test]
fn bad_specs_are_errors_naming_the_problem() {
    let (vocab, _) = byte_vocab();
    let err = GrammarSpec::JsonSchema(json!({"type": "strnig"})).compile(&vocab).unwrap_err();
    assert!(matches!(&err, treespec_grammar::GrammarError::BadSchema(m) if m.contains("strnig")), "{err}");
    let err = GrammarSpec::JsonSchema(json!(42)).compile(&vocab).unwrap_err();
    assert!(matches!(err, treespec_grammar::GrammarError::BadSchema(_)), "{err}");
    let err = GrammarSpec::Lark("start: foo_rule\n".into()).compile(&vocab).unwrap_err();
    assert!(matches!(&err, treespec_grammar::GrammarError::BadGrammar(m) if m.contains("foo_rule")), "{err}");
    let err = GrammarSpec::Regex("a(".into()).compile(&vocab).unwrap_err();
    assert!(matches!(err, treespec_grammar::GrammarError::BadGrammar(_)), "{err}");
    assert!(Vocabulary::new(&[b"a".to_vec()], &[3], &[]).is_err());
    assert!(Vocabulary::new(&[b"a".to_vec()], &[], &[]).is_err());
}

#[test]
fn commit_replays_checked_tokens_without_masks() {
    let (vocab, eos) = toy_vocab();
    let grammar = GrammarSpec::JsonSchema(schema()).compile(&vocab).unwrap();
    let path = random_walk(&mut grammar.constraint(), 7, 400);
    let (mut checked, mut committed) = (grammar.constraint(), grammar.constraint());
    let half = path.len() / 2;
    checked.advance_all(&path[..half]).unwrap();
    committed.commit(&path[..half]).unwrap();
    assert_eq!(committed.mask().unwrap().as_words(), checked.mask().unwrap().as_words());
    // What the grammar cannot take at all is refused, and the state stays put.
    assert!(matches!(
        committed.commit(&[u32::from(b'\n')]),
        Err(treespec_grammar::GrammarError::Rejected { .. })
    ));
    assert!(committed.commit(&[eos]).is_err());
    assert_eq!(committed.len(), half);
    committed.commit(&path[half..]).unwrap();
    assert!(committed.is_finished());
}
