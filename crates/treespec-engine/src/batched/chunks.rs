//! Which prompts a step reads, and how much of each: the step's prompt chunks.
//!
//! A step takes as long as its rows, and prompt rows dominate (a 256-token chunk costs a CPU
//! target seconds where a tree costs tens of milliseconds), so which prompt a step reads decides
//! every waiting request's time to first token. Three rules, in order:
//!
//! - **Shortest prompt first.** A short prompt (a chat's next turn, whose earlier turns are
//!   cached) read before a long one gets its first token in a fraction of a second; read after it,
//!   it waits for the whole long prompt. Shortest-remaining-first minimises the mean wait.
//! - **A short step when a first token is near.** When a chunk finishes a prompt (its request's
//!   first tree rides that chunk, `propose.rs`), or a lane whose prompt is in is about to take
//!   its first step, the step carries no chunk that finishes nothing: the first token comes out
//!   of a step of a few rows instead of one also carrying another request's 256-token chunk. The
//!   long prompt is delayed by those short steps only.
//! - **No prompt starves.** A lane passed over [`STARVE_STEPS`] steps in a row is served ahead
//!   of every shorter prompt and whatever a first token wants, oldest first.
//!
//! None of this changes any request's output: a prompt's rows are the same whichever step reads
//! them.

/// Steps in a row a lane with prompt left may get no chunk before it is served ahead of every
/// other rule (a stream of short prompts delays a long one by at most this many steps at a
/// time).
pub(super) const STARVE_STEPS: u32 = 4;

/// What the planner knows of a lane's prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PromptLeft {
    /// Prompt-head tokens it has still to read (0: its prompt is in).
    pub(super) left: usize,
    /// It was passed over for [`STARVE_STEPS`] steps in a row.
    pub(super) starved: bool,
}

/// A prompt chunk of the step: member `member` feeds the next `tokens` tokens of its prompt head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) member: usize,
    pub(super) tokens: usize,
}

/// The step's chunks over `lanes` (by member): at most `prefill_chunk` tokens in all and no more
/// than `room_rows`, starved lanes first (oldest first), then shortest prompt first (oldest
/// first among equals). Once the step holds a chunk that finishes a prompt, or when
/// `first_token_due` (a lane whose prompt is in takes its first step), chunks that finish
/// nothing are left for a later step unless their lane is starved.
pub(super) fn plan_chunks(
    lanes: &[PromptLeft],
    first_token_due: bool,
    prefill_chunk: usize,
    room_rows: usize,
) -> Vec<Chunk> {
    let mut order: Vec<usize> = (0..lanes.len()).filter(|&m| lanes[m].left > 0).collect();
    order.sort_by_key(|&m| match lanes[m] {
        PromptLeft { starved: true, .. } => (0, 0, m),
        PromptLeft { left, .. } => (1, left, m),
    });
    let mut chunks = Vec::new();
    let (mut budget, mut rows, mut short) = (prefill_chunk.max(1), 0usize, first_token_due);
    for member in order {
        let PromptLeft { left, starved } = lanes[member];
        let tokens = left.min(budget).min(room_rows.saturating_sub(rows));
        if tokens == 0 {
            break;
        }
        let finishes = tokens == left;
        if short && !finishes && !starved {
            // Every later lane's prompt is at least as long: none finishes either.
            break;
        }
        chunks.push(Chunk { member, tokens });
        budget -= tokens;
        rows += tokens;
        short |= finishes;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn left(left: usize) -> PromptLeft {
        PromptLeft { left, starved: false }
    }

    fn starved(left: usize) -> PromptLeft {
        PromptLeft { left, starved: true }
    }

    fn chunk(member: usize, tokens: usize) -> Chunk {
        Chunk { member, tokens }
    }

    #[test]
    fn a_long_prompt_alone_reads_a_full_chunk_per_step() {
        assert_eq!(plan_chunks(&[left(0), left(2000), left(0)], false, 256, 10_000), [chunk(1, 256)]);
        // The forward's room bounds it too.
        assert_eq!(plan_chunks(&[left(2000)], false, 256, 100), [chunk(0, 100)]);
    }

    #[test]
    fn a_short_prompt_that_joined_later_is_read_first_and_alone() {
        // Member 0 (older) has 2000 tokens left; member 2 joined with 27.
        assert_eq!(plan_chunks(&[left(2000), left(0), left(27)], false, 256, 10_000), [chunk(2, 27)]);
        // Two short prompts that both fit finish together; the long one waits.
        assert_eq!(
            plan_chunks(&[left(2000), left(51), left(27)], false, 256, 10_000),
            [chunk(2, 27), chunk(1, 51)]
        );
    }

    #[test]
    fn the_shortest_prompt_goes_first_when_none_finishes() {
        // 300 does not fit the 256 budget: it is read first, and the longer one gets nothing.
        assert_eq!(plan_chunks(&[left(2000), left(300)], false, 256, 10_000), [chunk(1, 256)]);
        // With budget to spare after a prompt that does not finish, nothing is left to add.
        assert_eq!(plan_chunks(&[left(900), left(700)], false, 512, 10_000), [chunk(1, 512)]);
    }

    #[test]
    fn a_first_token_due_keeps_the_step_short() {
        // No chunk that finishes nothing while a lane takes its first step...
        assert_eq!(plan_chunks(&[left(2000), left(0)], true, 256, 10_000), []);
        // ...but a prompt that finishes still joins it.
        assert_eq!(plan_chunks(&[left(2000), left(0), left(40)], true, 256, 10_000), [chunk(2, 40)]);
    }

    #[test]
    fn a_starved_lane_is_served_before_everything() {
        assert_eq!(
            plan_chunks(&[starved(2000), left(27)], true, 256, 10_000),
            [chunk(0, 256)],
            "the starved lane takes the whole budget, the short prompt waits a step"
        );
        assert_eq!(
            plan_chunks(&[starved(200), left(27), starved(900)], false, 256, 10_000),
            [chunk(0, 200), chunk(2, 56)],
            "starved lanes oldest first, then the rest of the budget"
        );
    }

    #[test]
    fn no_prompt_left_no_chunks() {
        assert_eq!(plan_chunks(&[left(0), left(0)], false, 256, 10_000), []);
        assert_eq!(plan_chunks(&[], true, 256, 10_000), []);
        // A zero budget still reads one token (a misconfigured limit cannot stall prefill).
        assert_eq!(plan_chunks(&[left(10)], false, 0, 10_000), [chunk(0, 1)]);
    }
}
