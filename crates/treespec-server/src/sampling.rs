//! Sampling fields of a request → [`SamplingParams`], with the CLI's rules.
//!
//! Besides OpenAI's `temperature` and `top_p`, clients written for llama-server send `top_k`,
//! `min_p`, `repeat_penalty` and `repeat_last_n`, and OpenAI clients `presence_penalty` and
//! `frequency_penalty` (applied over `repeat_last_n` tokens, as llama-server does); they change the result, so each is either
//! honoured (validated exactly as `treespec generate` validates `--top-k` and friends, by
//! [`SamplingParams::validate`]) or refused, never ignored. The raw JSON values are checked here so
//! that a wrong type names its field.

use serde_json::Value;
use treespec_core::sampling::SamplingParams;

use crate::api::CommonParams;
use crate::error::ApiError;

/// A number, or None when absent or null.
fn number(v: &Option<Value>, param: &'static str) -> Result<Option<f64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(ApiError::invalid(param, format!("`{param}` must be a number, got {other}"))),
    }
}

/// A whole number, or None when absent or null.
fn integer(v: &Option<Value>, param: &'static str) -> Result<Option<i64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
        Some(other) => {
            Err(ApiError::invalid(param, format!("`{param}` must be a whole number, got {other}")))
        }
    }
}

/// The request's sampling parameters (OpenAI defaults: temperature 1, top_p 1).
pub fn params(c: &CommonParams) -> Result<SamplingParams, ApiError> {
    let temperature = c.temperature.unwrap_or(1.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::invalid("temperature", format!("temperature must be ≥ 0, got {temperature}")));
    }
    if temperature > 2.0 {
        return Err(ApiError::invalid("temperature", format!("temperature must be ≤ 2, got {temperature}")));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", format!("top_p must be in (0, 1], got {top_p}")));
    }
    let d = SamplingParams::default();
    let top_k = match integer(&c.top_k, "top_k")? {
        None => None,
        Some(k) if k < 1 => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be ≥ 1 (omit it to disable), got {k}"),
            ))
        }
        Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let penalty_last_n = match integer(&c.repeat_last_n, "repeat_last_n")? {
        None => d.penalty_last_n,
        // llama-server's -1: the whole context.
        Some(-1) => usize::MAX,
        Some(n) if n < 0 => {
            return Err(ApiError::invalid("repeat_last_n", format!("repeat_last_n must be ≥ -1, got {n}")))
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let p = SamplingParams {
        temperature: temperature as f32,
        top_k,
        top_p: top_p as f32,
        min_p: number(&c.min_p, "min_p")?.map_or(d.min_p, |v| v as f32),
        repetition_penalty: number(&c.repeat_penalty, "repeat_penalty")?
            .map_or(d.repetition_penalty, |v| v as f32),
        penalty_last_n,
        presence_penalty: number(&c.presence_penalty, "presence_penalty")?
            .map_or(d.presence_penalty, |v| v as f32),
        frequency_penalty: number(&c.frequency_penalty, "frequency_penalty")?
            .map_or(d.frequency_penalty, |v| v as f32),
    };
    p.validate().map_err(|e| {
        let param = match e.to_string() {
            m if m.contains("min-p") => "min_p",
            m if m.contains("repetition") => "repeat_penalty",
            m if m.contains("presence") => "presence_penalty",
            m if m.contains("frequency") => "frequency_penalty",
            _ => "temperature",
        };
        ApiError::invalid(param, e.to_string())
    })?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<SamplingParams, ApiError> {
        params(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn llama_server_fields_are_honoured() {
        let p = parse(json!({"temperature": 0.7, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 32}))
            .unwrap();
        assert_eq!(p.top_k, Some(40));
        assert_eq!((p.min_p, p.repetition_penalty, p.penalty_last_n), (0.05, 1.1, 32));
        let p = parse(json!({"repetition_penalty": 1.2, "penalty_last_n": -1, "top_k": null})).unwrap();
        assert_eq!((p.repetition_penalty, p.penalty_last_n, p.top_k), (1.2, usize::MAX, None));
        let p = parse(json!({"presence_penalty": 0.5, "frequency_penalty": -0.25})).unwrap();
        assert_eq!((p.presence_penalty, p.frequency_penalty), (0.5, -0.25));
        assert_eq!(
            parse(json!({})).unwrap(),
            SamplingParams { temperature: 1.0, ..SamplingParams::default() }
        );
    }

    #[test]
    fn bad_values_and_types_name_their_field() {
        for (field, v) in [
            ("top_k", json!(0)),
            ("top_k", json!(-5)),
            ("top_k", json!(2.5)),
            ("top_k", json!("40")),
            ("min_p", json!(1.5)),
            ("min_p", json!(-0.1)),
            ("min_p", json!("0.1")),
            ("min_p", json!([0.1])),
            ("repeat_penalty", json!(0)),
            ("repeat_penalty", json!(-1.0)),
            ("repeat_penalty", json!(true)),
            ("repeat_last_n", json!(-2)),
            ("repeat_last_n", json!("64")),
            ("presence_penalty", json!(2.5)),
            ("presence_penalty", json!("0.5")),
            ("frequency_penalty", json!(-3)),
        ] {
            let e = parse(json!({ field: v })).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{field}={v}: {}", e.message);
        }
    }
}
