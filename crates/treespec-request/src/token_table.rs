//! Every token's bytes, for grammar engines (structured output): what a token spells as
//! generated text, which tokens are control tokens, and which end generation. A backend reads it
//! off its model (llama.cpp's: `treespec_llama::read_token_table`).

use treespec_core::TokenId;

/// The target's vocabulary as bytes.
#[derive(Debug, Clone)]
pub struct TokenTable {
    /// Token id → the bytes it spells (control tokens: their special text).
    pub tokens: Vec<Vec<u8>>,
    /// End-of-generation tokens.
    pub eos: Vec<TokenId>,
    /// Control tokens (empty as text, non-empty as special text): never matched by grammar text.
    pub special: Vec<TokenId>,
}

impl TokenTable {
    /// The tokens spelling exactly `tags` (an opening and a closing tag), when both are single
    /// tokens of this vocabulary.
    pub fn tag_pair(&self, (open, close): (&str, &str)) -> Option<(TokenId, TokenId)> {
        let find = |tag: &str| self.tokens.iter().position(|t| t == tag.as_bytes()).map(|i| i as TokenId);
        Some((find(open)?, find(close)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_tags_are_found_only_as_whole_tokens() {
        let table = |tokens: &[&str]| TokenTable {
            tokens: tokens.iter().map(|t| t.as_bytes().to_vec()).collect(),
            eos: vec![],
            special: vec![],
        };
        let tags = ("<tool_call>", "</tool_call>");
        assert_eq!(table(&["a", "</tool_call>", "<tool_call>"]).tag_pair(tags), Some((2, 1)));
        assert_eq!(table(&["<tool", "_call>", "</tool_call>"]).tag_pair(tags), None, "split opening tag");
        assert_eq!(table(&["<tool_call>", "</tool_call>\n"]).tag_pair(tags), None);
    }
}
