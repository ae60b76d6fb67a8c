//! Sampling fields of a request → [`SamplingParams`], with the CLI's rules.
//!
//! Besides OpenAI's `temperature` and `top_p`, clients written for llama-server send `top_k`,
//! `min_p`, `repeat_penalty` and `repeat_last_n`, and OpenAI clients `presence_penalty` and
//! `frequency_penalty` (applied over `repeat_last_n` tokens, as llama-server does); they change the result, so each is either
//! honoured (validated exactly as `treespec generate` validates `--top-k` and friends, by
//! [`SamplingParams::validate`]) or refused, never ignored. The raw JSON values are checked here so
//! that a wrong type names its field.
//!
//! llama-server's `samplers` (the order of its sampler chain, as names or as letters) is honoured
//! where it is an order treespec's one pipeline runs (see [`samplers`]); a sampler left out of
//! the list is off, as in llama-server. Any other order, and samplers treespec does not have, are
//! refused.

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
pub(crate) fn integer(v: &Option<Value>, param: &'static str) -> Result<Option<i64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
        Some(other) => {
            Err(ApiError::invalid(param, format!("`{param}` must be a whole number, got {other}")))
        }
    }
}

/// The server's sampling defaults (llama-server's `--temp`, `--top-k`, `--top-p`, `--min-p`,
/// `--seed`, `--repeat-penalty`, `--repeat-last-n`): what a request that sets a field not gets
/// instead of the route's own default. None: the route's default.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingDefaults {
    /// Temperature.
    pub temperature: Option<f64>,
    /// Top-k (0: off).
    pub top_k: Option<i64>,
    /// Nucleus threshold.
    pub top_p: Option<f64>,
    /// Min-p.
    pub min_p: Option<f64>,
    /// Seed.
    pub seed: Option<i64>,
    /// Repetition penalty.
    pub repeat_penalty: Option<f64>,
    /// Tokens the repetition penalty looks back over (-1: all).
    pub repeat_last_n: Option<i64>,
}

impl SamplingDefaults {
    /// Give each field `c` leaves unset the server's default, before the request is checked (so
    /// a bad default is reported as the request's field would be, and every route means the same).
    pub fn fill(&self, c: &mut CommonParams) {
        c.temperature = c.temperature.or(self.temperature);
        c.top_p = c.top_p.or(self.top_p);
        c.seed = c.seed.or(self.seed);
        let value = |set: &mut Option<Value>, default: Option<Value>| {
            if set.is_none() {
                *set = default;
            }
        };
        value(&mut c.top_k, self.top_k.map(Value::from));
        value(&mut c.min_p, self.min_p.map(Value::from));
        value(&mut c.repeat_penalty, self.repeat_penalty.map(Value::from));
        value(&mut c.repeat_last_n, self.repeat_last_n.map(Value::from));
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
    if !(0.0..=1.0).contains(&top_p) {
        return Err(ApiError::invalid("top_p", format!("top_p must be in [0, 1], got {top_p}")));
    }
    // OpenAI's clients send `top_p: 0` for greedy decoding: a nucleus of no mass keeps the one
    // most likely token (as llama.cpp's sampler keeps at least one), which is greedy decoding.
    let (temperature, top_p) = if top_p == 0.0 { (0.0, 1.0) } else { (temperature, top_p) };
    let d = SamplingParams::default();
    let top_k = match integer(&c.top_k, "top_k")? {
        // llama.cpp's (and llama-server's) 0: no top-k.
        None | Some(0) => None,
        Some(k) if k < 0 => {
            return Err(ApiError::invalid("top_k", format!("top_k must be ≥ 0 (0 or omitted: off), got {k}")))
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
    let mut p = SamplingParams {
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
        // A named seed decides the text under every method (docs/METHODS.md).
        reproducible: c.seed.is_some(),
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
    if let Some(chain) = samplers(&c.samplers)? {
        chain.switch_off_the_rest(&mut p);
    }
    Ok(p)
}

/// One of llama-server's samplers (its `common_sampler_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sampler {
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    TypicalP,
    TopP,
    MinP,
    Xtc,
    Temperature,
    Infill,
    AdaptiveP,
}

impl Sampler {
    /// By name, as llama-server reads them: any case, `-` for `_` or neither, and its aliases.
    fn by_name(name: &str) -> Option<Self> {
        use Sampler::*;
        Some(match name.to_ascii_lowercase().as_str() {
            "penalties" => Penalties,
            "dry" => Dry,
            "top_n_sigma" | "top-n-sigma" | "topnsigma" => TopNSigma,
            "top_k" | "top-k" | "topk" => TopK,
            "typ_p" | "typ-p" | "typp" | "typ" | "typical_p" | "typical-p" | "typical" => TypicalP,
            "top_p" | "top-p" | "topp" | "nucleus" => TopP,
            "min_p" | "min-p" | "minp" => MinP,
            "xtc" => Xtc,
            "temperature" | "temp" => Temperature,
            "infill" => Infill,
            "adaptive_p" | "adaptive-p" | "adaptivep" => AdaptiveP,
            _ => return None,
        })
    }

    /// By letter (`--sampling-seq`, a `samplers` string: llama-server's default is `edskypmxt`).
    fn by_letter(c: char) -> Option<Self> {
        use Sampler::*;
        Some(match c {
            'e' => Penalties,
            'd' => Dry,
            's' => TopNSigma,
            'k' => TopK,
            'y' => TypicalP,
            'p' => TopP,
            'm' => MinP,
            'x' => Xtc,
            't' => Temperature,
            'i' => Infill,
            'a' => AdaptiveP,
            _ => return None,
        })
    }

    /// The name in messages.
    fn name(self) -> &'static str {
        use Sampler::*;
        match self {
            Penalties => "penalties",
            Dry => "dry",
            TopNSigma => "top_n_sigma",
            TopK => "top_k",
            TypicalP => "typ_p",
            TopP => "top_p",
            MinP => "min_p",
            Xtc => "xtc",
            Temperature => "temperature",
            Infill => "infill",
            AdaptiveP => "adaptive_p",
        }
    }
}

/// The samplers a `samplers` list turns on, in an order treespec runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chain(Vec<Sampler>);

impl Chain {
    /// A sampler left out of the list does not run (llama-server's rule): its parameter is set
    /// to its neutral value. Temperature left out is 1 (llama-server then samples the
    /// distribution as it stands).
    fn switch_off_the_rest(&self, p: &mut SamplingParams) {
        let on = |s| self.0.contains(&s);
        if !on(Sampler::Penalties) {
            p.repetition_penalty = 1.0;
            p.presence_penalty = 0.0;
            p.frequency_penalty = 0.0;
        }
        if !on(Sampler::TopK) {
            p.top_k = None;
        }
        if !on(Sampler::TopP) {
            p.top_p = 1.0;
        }
        if !on(Sampler::MinP) {
            p.min_p = 0.0;
        }
        if !on(Sampler::Temperature) {
            p.temperature = 1.0;
        }
    }
}

/// What the one pipeline ([`treespec_core::sampling`]) runs: penalties, temperature, top-k,
/// top-p, min-p. Temperature and top-k commute (top-k keeps the same tokens at any
/// temperature), so either may come first.
const PIPELINE: [(Sampler, u8); 5] = [
    (Sampler::Penalties, 0),
    (Sampler::Temperature, 1),
    (Sampler::TopK, 1),
    (Sampler::TopP, 2),
    (Sampler::MinP, 3),
];

/// llama-server's default order of the same samplers (its `--samplers` default, without the
/// ones treespec has only at their neutral values): temperature last.
const LLAMA_DEFAULT: [Sampler; 5] =
    [Sampler::Penalties, Sampler::TopK, Sampler::TopP, Sampler::MinP, Sampler::Temperature];

/// llama-server's `samplers`: a list of names (`["top_k", "top_p", "temperature"]`) or a string
/// of letters (`"kpt"`). None: absent or null, llama-server's default order.
///
/// - `dry`, `top_n_sigma`, `typ_p` and `xtc` run only at their neutral values here (their
///   parameters are refused otherwise), where they change nothing: they may stand anywhere.
/// - `infill`, `adaptive_p` and names llama-server does not know: refused.
/// - The others, each at most once, in an order the pipeline runs ([`PIPELINE`]), or in
///   llama-server's default order or a part of it ([`LLAMA_DEFAULT`], which puts temperature
///   last: accepted, as that order is what clients send when they send the default, and run
///   with temperature first, as every request without `samplers` is; see docs/SERVING.md).
///   Anything else is refused rather than run in another order.
/// - A sampler not listed is off (see [`Chain::switch_off_the_rest`]).
fn samplers(v: &Option<Value>) -> Result<Option<Chain>, ApiError> {
    let unsupported = |m: String| ApiError::invalid("samplers", m).with_code("unsupported_parameter");
    let shape = || {
        ApiError::invalid(
            "samplers",
            "`samplers` must be a list of sampler names or a string of sampler letters",
        )
    };
    let listed: Vec<Sampler> = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(letters)) => letters
            .chars()
            .map(|c| {
                Sampler::by_letter(c)
                    .ok_or_else(|| unsupported(format!("unknown sampler letter {c:?} in `samplers`")))
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| {
                let n = n.as_str().ok_or_else(shape)?;
                Sampler::by_name(n).ok_or_else(|| unsupported(format!("unknown sampler {n:?} in `samplers`")))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(shape()),
    };
    let mut chain = Vec::new();
    for s in listed {
        match s {
            Sampler::Dry | Sampler::TopNSigma | Sampler::TypicalP | Sampler::Xtc => {}
            Sampler::Infill | Sampler::AdaptiveP => {
                return Err(unsupported(format!("the `{}` sampler is not supported", s.name())))
            }
            s if chain.contains(&s) => {
                return Err(unsupported(format!("`samplers` lists `{}` twice: each runs once", s.name())))
            }
            s => chain.push(s),
        }
    }
    let rank = |s: &Sampler| PIPELINE.iter().find(|(p, _)| p == s).map_or(0, |(_, r)| *r);
    let runs = chain.windows(2).all(|w| rank(&w[0]) <= rank(&w[1]));
    let position = |s: &Sampler| LLAMA_DEFAULT.iter().position(|d| d == s);
    let llama_default = chain.windows(2).all(|w| position(&w[0]) < position(&w[1]));
    if !runs && !llama_default {
        let names: Vec<&str> = chain.iter().map(|s| s.name()).collect();
        return Err(unsupported(format!(
            "`samplers` order [{}] is not supported: treespec runs penalties, then temperature and \
             top_k, then top_p, then min_p (temperature may also be listed last, as in \
             llama-server's default order)",
            names.join(", ")
        )));
    }
    Ok(Some(Chain(chain)))
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
    fn server_defaults_fill_only_what_a_request_leaves_unset() {
        let defaults =
            SamplingDefaults { temperature: Some(0.2), top_k: Some(5), seed: Some(9), ..Default::default() };
        let mut c: CommonParams = serde_json::from_value(json!({"top_k": 40})).unwrap();
        defaults.fill(&mut c);
        let p = params(&c).unwrap();
        assert_eq!((p.temperature, p.top_k, c.seed), (0.2, Some(40), Some(9)));
        let mut untouched: CommonParams = serde_json::from_value(json!({"temperature": 1.5})).unwrap();
        SamplingDefaults::default().fill(&mut untouched);
        assert_eq!(
            params(&untouched).unwrap(),
            params(&serde_json::from_value(json!({"temperature": 1.5})).unwrap()).unwrap()
        );
    }

    #[test]
    fn bad_values_and_types_name_their_field() {
        for (field, v) in [
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

    /// llama-server's sampling settings, every sampler on.
    fn llama(samplers: Value) -> Result<SamplingParams, ApiError> {
        parse(json!({"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
            "repeat_penalty": 1.1, "presence_penalty": 0.5, "samplers": samplers}))
    }

    #[test]
    fn samplers_in_an_order_the_pipeline_runs_are_honoured() {
        let all = llama(Value::Null).unwrap();
        assert_eq!((all.top_k, all.top_p, all.min_p, all.temperature), (Some(40), 0.95, 0.05, 0.8));
        for order in [
            // llama-server's default, by name (with the neutral-only samplers) and by letter.
            json!([
                "penalties",
                "dry",
                "top_n_sigma",
                "top_k",
                "typ_p",
                "top_p",
                "min_p",
                "xtc",
                "temperature"
            ]),
            json!("edskypmxt"),
            // Older spellings (`typical_p`) and without the neutral-only samplers.
            json!(["penalties", "dry", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature"]),
            json!(["penalties", "top_k", "top_p", "min_p", "temperature"]),
            // The pipeline's own order, temperature and top-k either way round, aliases, any case.
            json!(["penalties", "temperature", "top_k", "top_p", "min_p"]),
            json!(["Penalties", "top-k", "temp", "nucleus", "minp"]),
            json!("etkpm"),
        ] {
            assert_eq!(llama(order.clone()).unwrap(), all, "{order}");
        }
        // A part of an accepted order: the samplers left out are off, as in llama-server.
        let p = llama(json!(["top_k", "temperature"])).unwrap();
        assert_eq!((p.top_k, p.top_p, p.min_p, p.temperature), (Some(40), 1.0, 0.0, 0.8));
        assert_eq!((p.repetition_penalty, p.presence_penalty), (1.0, 0.0));
        let p = llama(json!("pm")).unwrap();
        assert_eq!((p.top_k, p.top_p, p.min_p, p.temperature), (None, 0.95, 0.05, 1.0));
        // llama-server's README's default leaves penalties out: they are off then.
        let p = llama(json!(["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"])).unwrap();
        assert_eq!((p.repetition_penalty, p.presence_penalty, p.top_p), (1.0, 0.0, 0.95));
        let p = llama(json!(["penalties"])).unwrap();
        assert_eq!((p.repetition_penalty, p.presence_penalty, p.top_k), (1.1, 0.5, None));
        let p = llama(json!([])).unwrap();
        assert_eq!(p, SamplingParams { temperature: 1.0, ..SamplingParams::default() });
        let p = llama(json!("edkypmxt")).unwrap();
        assert_eq!(p, all, "without top_n_sigma");
    }

    #[test]
    fn other_samplers_and_orders_are_refused_naming_samplers() {
        for bad in [
            json!(["x"]),
            json!(["top_k", "tfs_z"]),
            json!("kpz"),
            json!(["infill"]),
            json!(["adaptive_p", "temperature"]),
            json!("ka"),
            // Another order than the pipeline's or llama-server's default.
            json!(["top_p", "top_k"]),
            json!(["min_p", "top_p"]),
            json!(["top_k", "top_p", "temperature", "min_p"]),
            json!(["temperature", "penalties"]),
            json!(["top_k", "penalties"]),
            json!("pk"),
            // Twice.
            json!(["temperature", "temperature"]),
            json!("kk"),
        ] {
            let e = llama(bad.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("samplers"), "{bad}: {e:?}");
            assert_eq!(e.code, Some("unsupported_parameter"), "{bad}: {e:?}");
        }
        for shape in [json!(3), json!([1, 2]), json!({"top_k": 1}), json!([["top_k"]]), json!(true)] {
            let e = llama(shape.clone()).unwrap_err();
            assert_eq!((e.param.as_deref(), e.code), (Some("samplers"), None), "{shape}: {e:?}");
        }
    }
}
