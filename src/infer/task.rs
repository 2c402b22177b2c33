//! Multiple-choice questions scored by log-likelihood (LAMBADA/HellaSwag style): each
//! choice is appended to the question's context and the choice whose tokens the model finds
//! most likely wins, by total and by per-token mean log-probability.
//!
//! # Format
//! One JSON object per line; blank lines are skipped:
//! ```text
//! {"context": "The cat sat on the", "choices": [" mat", " sky"], "answer": 0}
//! ```

use std::path::Path;

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::{Chain, InferError};
use crate::data::Tokenizer;

/// One question.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// Text before the choices.
    pub context: String,
    /// The candidate continuations.
    pub choices: Vec<String>,
    /// Index of the right choice.
    pub answer: usize,
}

/// What a task run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskReport {
    /// Questions scored.
    pub questions: usize,
    /// Right answers by the total log-probability of a choice's tokens.
    pub correct: usize,
    /// `correct / questions`.
    pub accuracy: f64,
    /// Right answers by the mean log-probability per token of a choice (length-normalised).
    pub correct_per_token: usize,
    /// `correct_per_token / questions`.
    pub accuracy_per_token: f64,
    /// Accuracy of guessing: the mean of `1 / choices`.
    pub chance: f64,
}

/// Reads a JSONL file of questions.
///
/// # Errors
/// An unreadable file, a line that is not a question (named by number), a question with
/// fewer than two choices or an answer out of range, or no question at all.
pub fn read_questions(path: &Path) -> Result<Vec<Question>, InferError> {
    let text = std::fs::read_to_string(path).map_err(|e| InferError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let bad = |line: usize, message: String| InferError::Read {
        path: path.to_path_buf(),
        message: format!("line {line}: {message}"),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: Question = serde_json::from_str(line).map_err(|e| bad(i + 1, e.to_string()))?;
        if q.choices.len() < 2 || q.answer >= q.choices.len() {
            return Err(bad(
                i + 1,
                format!(
                    "needs at least two choices and an answer among them (got {} choices, answer {})",
                    q.choices.len(),
                    q.answer
                ),
            ));
        }
        out.push(q);
    }
    if out.is_empty() {
        return Err(bad(0, "no questions".into()));
    }
    Ok(out)
}

/// Log-probability of `choice` after `context`: its sum and its mean per token. The
/// context is cut from the left to fit the model's context length.
fn score_choice<B: Backend>(
    chain: &Chain<B>,
    context: &[u32],
    choice: &[u32],
) -> Result<(f64, f64), InferError> {
    let window_len = chain.context() + 1;
    if choice.is_empty() || choice.len() >= window_len {
        return Err(InferError::BadInput(format!(
            "a choice of {} tokens: must be 1 to {}",
            choice.len(),
            window_len - 1
        )));
    }
    let mut window: Vec<u32> = context.to_vec();
    window.extend_from_slice(choice);
    let start = window.len().saturating_sub(window_len);
    let log_probs = chain.target_log_probs(&window[start..])?;
    let total: f64 = log_probs[log_probs.len() - choice.len()..].iter().sum();
    Ok((total, total / choice.len() as f64))
}

/// The index of the largest value (the first on ties).
fn best(values: &[f64]) -> usize {
    let mut at = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[at] {
            at = i;
        }
    }
    at
}

/// Scores every question.
///
/// # Errors
/// An empty context with no end-of-text token to start from, an empty choice, text the
/// tokenizer refuses, or a failure in the model.
pub fn score<B: Backend>(
    chain: &Chain<B>,
    tokenizer: &Tokenizer,
    questions: &[Question],
) -> Result<TaskReport, InferError> {
    let (mut correct, mut correct_per_token, mut chance) = (0, 0, 0.0);
    for q in questions {
        let mut context = tokenizer.encode(&q.context)?;
        if context.is_empty() {
            context.extend(tokenizer.end_of_text());
        }
        if context.is_empty() {
            return Err(InferError::BadInput(
                "a question with an empty context".into(),
            ));
        }
        let mut totals = Vec::with_capacity(q.choices.len());
        let mut means = Vec::with_capacity(q.choices.len());
        for choice in &q.choices {
            let (total, mean) = score_choice(chain, &context, &tokenizer.encode(choice)?)?;
            totals.push(total);
            means.push(mean);
        }
        correct += usize::from(best(&totals) == q.answer);
        correct_per_token += usize::from(best(&means) == q.answer);
        chance += 1.0 / q.choices.len() as f64;
    }
    let n = questions.len().max(1) as f64;
    Ok(TaskReport {
        questions: questions.len(),
        correct,
        accuracy: correct as f64 / n,
        correct_per_token,
        accuracy_per_token: correct_per_token as f64 / n,
        chance: chance / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::chain::tests::tiny_chain;

    #[test]
    fn the_choice_the_model_prefers_is_scored_right() {
        let chain = tiny_chain();
        let tok = Tokenizer::byte();
        // Among one-byte printable continuations, the model's most and least likely next
        // byte: a question whose answer is the most likely one is answered right.
        let context = tok.encode("abc").unwrap();
        let logits = chain.next_logits(&context).unwrap();
        let printable = 32u8..127;
        let by_logit = |a: &u8, b: &u8| logits[*a as usize].total_cmp(&logits[*b as usize]);
        let top = printable.clone().max_by(by_logit).unwrap();
        let low = printable.min_by(by_logit).unwrap();
        assert_ne!(top, low);
        let q = Question {
            context: "abc".into(),
            choices: vec![(low as char).to_string(), (top as char).to_string()],
            answer: 1,
        };
        let report = score(&chain, &tok, std::slice::from_ref(&q)).unwrap();
        assert_eq!((report.questions, report.correct), (1, 1));
        assert_eq!(report.correct_per_token, 1);
        assert_eq!(report.chance, 0.5);
        let wrong = Question { answer: 0, ..q };
        assert_eq!(score(&chain, &tok, &[wrong]).unwrap().correct, 0);
    }

    #[test]
    fn malformed_question_files_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.jsonl");
        std::fs::write(
            &path,
            "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": 0}\n\n{\"context\": 1}\n",
        )
        .unwrap();
        let err = read_questions(&path).unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
        std::fs::write(
            &path,
            "{\"context\": \"a\", \"choices\": [\"b\"], \"answer\": 0}\n",
        )
        .unwrap();
        let err = read_questions(&path).unwrap_err().to_string();
        assert!(err.contains("two choices"), "{err}");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_questions(&path).is_err());
    }
}
