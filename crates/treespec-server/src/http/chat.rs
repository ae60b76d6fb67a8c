//! The chat page's answer (`GET /`): the page, with headers that keep it to itself. The page
//! is one file with its script and style inline (no build step, nothing fetched but this
//! server's API), so its Content-Security-Policy lists those blocks by their SHA-256 hashes,
//! computed from the page in the binary the first time it is served: any other script or style
//! (injected markup, inline event handlers, `style` attributes, other origins) does not run,
//! the page may not be framed, and nothing but this server is fetched.

use std::sync::OnceLock;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The page.
pub const PAGE: &str = include_str!("chat.html");

/// `GET /`: the page, its policy, and no framing, sniffing or referrer.
pub fn response() -> Response {
    static POLICY: OnceLock<HeaderValue> = OnceLock::new();
    let policy =
        POLICY.get_or_init(|| HeaderValue::from_str(&policy(PAGE)).expect("a policy is printable ASCII"));
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
        (header::CONTENT_SECURITY_POLICY, policy.clone()),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    (headers, PAGE).into_response()
}

/// The Content-Security-Policy of `page`: only this server (`default-src 'self'`), only the
/// page's own inline scripts and styles (by hash), no plugins, no `<base>`, no form submission,
/// no framing.
pub fn policy(page: &str) -> String {
    let sources = |tag: &str| {
        let hashes: Vec<String> = inline_blocks(page, tag).map(hash_source).collect();
        if hashes.is_empty() {
            "'none'".to_string()
        } else {
            hashes.join(" ")
        }
    };
    format!(
        "default-src 'self'; script-src {}; style-src {}; object-src 'none'; base-uri 'none'; \
         form-action 'none'; frame-ancestors 'none'",
        sources("script"),
        sources("style")
    )
}

/// The text of every `<tag …>…</tag>` block of `page` (as the browser hashes it: everything
/// between the opening tag's `>` and the closing tag).
fn inline_blocks<'a>(page: &'a str, tag: &str) -> impl Iterator<Item = &'a str> + 'a {
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    let mut rest = page;
    std::iter::from_fn(move || loop {
        let at = rest.find(&open)?;
        let after = &rest[at + open.len()..];
        // `<style>` or `<style …>`, not `<styles>`.
        if !after.starts_with(|c: char| c == '>' || c.is_ascii_whitespace()) {
            rest = after;
            continue;
        }
        let body = &after[after.find('>')? + 1..];
        let end = body.find(&close)?;
        rest = &body[end + close.len()..];
        return Some(&body[..end]);
    })
}

/// `'sha256-…'`: a block's CSP source (SHA-256, standard base64 with padding).
fn hash_source(block: &str) -> String {
    format!("'sha256-{}'", BASE64.encode(Sha256::digest(block.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_hashed_as_browsers_hash_it() {
        // The CSP specification's example digest of `alert('Hello, world.');`.
        assert_eq!(
            hash_source("alert('Hello, world.');"),
            "'sha256-qznLcsROx4GACP2dm0UCKCzCG+HiZ1guq6ZZDob/Tng='"
        );
    }

    #[test]
    fn the_policy_lists_every_inline_block_of_the_page() {
        let page = "<style>a{}</style><styles>x</styles><script>1</script><script type=\"module\">2</script>";
        assert_eq!(inline_blocks(page, "style").collect::<Vec<_>>(), ["a{}"]);
        assert_eq!(inline_blocks(page, "script").collect::<Vec<_>>(), ["1", "2"]);
        let p = policy(page);
        let hash = hash_source;
        assert!(p.contains(&format!("script-src {} {};", hash("1"), hash("2"))), "{p}");
        assert!(p.contains(&format!("style-src {};", hash("a{}"))), "{p}");
        assert!(policy("<p>").contains("script-src 'none'; style-src 'none';"));
        // The real page: one script and one style, and the policy fits a header.
        assert_eq!((inline_blocks(PAGE, "script").count(), inline_blocks(PAGE, "style").count()), (1, 1));
        HeaderValue::from_str(&policy(PAGE)).unwrap();
    }
}
