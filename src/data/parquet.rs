//! Parquet shards: one document per row, from a string column (`text` unless configured).
//!
//! The shard is read row group by row group and page by page through the `parquet` crate's
//! column reader (no arrow), [`BATCH_ROWS`] rows at a time, so a 2 GB shard never sits in
//! memory whole. Null values are skipped, as blank lines of a `.jsonl` file are.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use ::parquet::column::reader::{ColumnReader, ColumnReaderImpl, get_column_reader};
use ::parquet::data_type::{ByteArray, ByteArrayType};
use ::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use ::parquet::file::serialized_reader::SerializedPageReader;
use ::parquet::schema::types::ColumnDescPtr;

use super::DataError;

/// Rows decoded per call of the column reader.
const BATCH_ROWS: usize = 256;

/// The documents of one shard, read lazily: the footer and schema at the first call of
/// `next`, then one batch of rows at a time. The first error ends the stream.
pub(super) struct ParquetRows {
    /// The shard (for messages).
    path: PathBuf,
    /// The text column's name.
    column: String,
    /// Where reading stands.
    state: State,
}

/// Where reading a shard stands.
enum State {
    /// Nothing read yet.
    Unopened,
    /// Footer read, schema checked.
    Open(Box<Shard>),
    /// All rows read, or an error was reported.
    Done,
}

/// An open shard and the position in it.
struct Shard {
    /// The file, shared with the page readers.
    file: Arc<File>,
    /// The footer.
    metadata: ParquetMetaData,
    /// The text column's descriptor.
    descr: ColumnDescPtr,
    /// Its leaf index in every row group.
    index: usize,
    /// The row group after the one being read.
    next_group: usize,
    /// The reader of the current row group's column chunk, if one is being read.
    reader: Option<ColumnReaderImpl<ByteArrayType>>,
    /// Rows read of the current row group.
    group_rows: u64,
    /// Rows read of the file before the current batch (for messages).
    rows_before: u64,
    /// The current batch's non-null values with their row numbers in the file, in reverse
    /// (so `pop` yields them in order).
    pending: Vec<(u64, ByteArray)>,
    /// Scratch buffers for one batch.
    values: Vec<ByteArray>,
    /// Definition levels of one batch (when the column is nullable).
    def_levels: Vec<i16>,
}

/// Checks that every Parquet shard among `files` has `column` as one string per row, reading
/// only each footer (no rows), so a run can refuse a shard of the wrong schema before it
/// starts even when it tokenizes the shards later.
///
/// # Errors
/// The first shard's [`DataError`] (one line naming the shard and the column).
pub(super) fn check_schemas(files: &[PathBuf], column: &str) -> Result<(), DataError> {
    for path in files
        .iter()
        .filter(|path| path.extension().is_some_and(|e| e == "parquet"))
    {
        ParquetRows::new(path, column).open()?;
    }
    Ok(())
}

impl ParquetRows {
    /// The rows of the shard at `path`, text in `column` (nothing is read yet).
    pub(super) fn new(path: &Path, column: &str) -> Self {
        Self {
            path: path.to_path_buf(),
            column: column.to_owned(),
            state: State::Unopened,
        }
    }

    /// An error about this shard and column.
    fn error(&self, reason: impl std::fmt::Display) -> DataError {
        DataError::BadParquet {
            path: self.path.clone(),
            column: self.column.clone(),
            // Parquet's messages can carry newlines; ours are one line.
            reason: reason.to_string().replace('\n', " "),
        }
    }

    /// Reads the footer and checks that the column holds one string per row.
    fn open(&self) -> Result<Shard, DataError> {
        let file = File::open(&self.path).map_err(|error| DataError::io(&self.path, error))?;
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .map_err(|e| self.error(format!("not a readable Parquet file: {e}")))?;
        let schema = metadata.file_metadata().schema_descr();
        let found = schema
            .columns()
            .iter()
            .position(|c| c.path().parts() == [self.column.as_str()]);
        let Some(index) = found else {
            let nested: Vec<String> = schema
                .columns()
                .iter()
                .filter(|c| c.path().parts().first() == Some(&self.column))
                .map(|c| c.path().string())
                .collect();
            if !nested.is_empty() {
                return Err(self.error(format!(
                    "a nested column ({}), not one string per row",
                    nested.join(", ")
                )));
            }
            let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
            return Err(self.error(format!(
                "no such column (the shard has: {})",
                names.join(", ")
            )));
        };
        let descr = Arc::clone(&schema.columns()[index]);
        let is_string = matches!(descr.logical_type_ref(), Some(LogicalType::String))
            || descr.converted_type() == ConvertedType::UTF8;
        if descr.physical_type() != PhysicalType::BYTE_ARRAY || !is_string {
            let kind = match descr.logical_type_ref() {
                Some(logical) => format!("{} ({logical:?})", descr.physical_type()),
                None => descr.physical_type().to_string(),
            };
            return Err(self.error(format!("not a string column (it holds {kind})")));
        }
        if descr.max_rep_level() > 0 {
            return Err(self.error("a repeated column, not one string per row"));
        }
        Ok(Shard {
            file: Arc::new(file),
            metadata,
            descr,
            index,
            next_group: 0,
            reader: None,
            group_rows: 0,
            rows_before: 0,
            pending: Vec::new(),
            values: Vec::new(),
            def_levels: Vec::new(),
        })
    }
}

impl Shard {
    /// Refills `pending` with the next batch of non-null values; `Ok(false)` at the end of
    /// the file.
    fn refill(&mut self) -> Result<bool, String> {
        loop {
            let Some(reader) = self.reader.as_mut() else {
                if self.next_group == self.metadata.num_row_groups() {
                    return Ok(false);
                }
                self.open_group()?;
                continue;
            };
            self.values.clear();
            self.def_levels.clear();
            let (rows, _, _) = reader
                .read_records(
                    BATCH_ROWS,
                    Some(&mut self.def_levels),
                    None,
                    &mut self.values,
                )
                .map_err(|e| self.in_group(e))?;
            if rows == 0 {
                let group = self.next_group - 1;
                let expected = self.metadata.row_group(group).num_rows();
                if i64::try_from(self.group_rows).ok() != Some(expected) {
                    return Err(format!(
                        "row group {group}: {} rows read, the footer says {expected}",
                        self.group_rows
                    ));
                }
                self.reader = None;
                continue;
            }
            let max_def = self.descr.max_def_level();
            let row_numbers: Vec<u64> = if max_def == 0 {
                (0..rows as u64).collect()
            } else {
                self.def_levels
                    .iter()
                    .enumerate()
                    .filter(|(_, level)| **level == max_def)
                    .map(|(row, _)| row as u64)
                    .collect()
            };
            if row_numbers.len() != self.values.len() {
                return Err(self.in_group(format!(
                    "{} values for {} non-null rows",
                    self.values.len(),
                    row_numbers.len()
                )));
            }
            let start = self.rows_before;
            self.pending = row_numbers
                .into_iter()
                .map(|row| start + row)
                .zip(self.values.drain(..))
                .rev()
                .collect();
            self.rows_before += rows as u64;
            self.group_rows += rows as u64;
            if !self.pending.is_empty() {
                return Ok(true);
            }
        }
    }

    /// Starts reading the column chunk of row group `next_group`.
    fn open_group(&mut self) -> Result<(), String> {
        let group = self.metadata.row_group(self.next_group);
        self.next_group += 1;
        let rows = usize::try_from(group.num_rows())
            .map_err(|_| self.in_group(format!("{} rows", group.num_rows())))?;
        let pages =
            SerializedPageReader::new(Arc::clone(&self.file), group.column(self.index), rows, None)
                .map_err(|e| self.in_group(e))?;
        match get_column_reader(Arc::clone(&self.descr), Box::new(pages)) {
            ColumnReader::ByteArrayColumnReader(reader) => self.reader = Some(reader),
            // `open` checked the physical type.
            _ => return Err(self.in_group("not a byte-array column")),
        }
        self.group_rows = 0;
        Ok(())
    }

    /// A message about the row group being read.
    fn in_group(&self, e: impl std::fmt::Display) -> String {
        format!("row group {}: {e}", self.next_group.saturating_sub(1))
    }
}

impl Iterator for ParquetRows {
    type Item = Result<String, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match &mut self.state {
                State::Done => return None,
                State::Unopened => match self.open() {
                    Ok(shard) => self.state = State::Open(Box::new(shard)),
                    Err(e) => {
                        self.state = State::Done;
                        return Some(Err(e));
                    }
                },
                State::Open(shard) => {
                    if let Some((row, value)) = shard.pending.pop() {
                        let text = String::from_utf8(value.data().to_vec()).map_err(|e| {
                            self.error(format!(
                                "row {row}: not valid UTF-8 (first bad byte at offset {})",
                                e.utf8_error().valid_up_to()
                            ))
                        });
                        if text.is_err() {
                            self.state = State::Done;
                        }
                        return Some(text);
                    }
                    match shard.refill() {
                        Ok(true) => {}
                        Ok(false) => {
                            self.state = State::Done;
                            return None;
                        }
                        Err(reason) => {
                            let e = self.error(reason);
                            self.state = State::Done;
                            return Some(Err(e));
                        }
                    }
                }
            }
        }
    }
}
