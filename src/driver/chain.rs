//! Which journal messages a replay applies, with no I/O: the rule `journal` replays by and the
//! simulator restores by.

/// Which journal messages a replay applies: every leader's writes form a chain, each stored
/// right after the one before it (or after the leader's own mark), and a message off its
/// writer's chain is skipped.
///
/// A leader's writes are pipelined, each expecting the sequence its predecessor takes. When a
/// successor's mark lands between two of them, the first is refused, but the second, expecting
/// exactly the sequence the mark took, is stored after it; and should the successor have two
/// writes in flight then, its own first is refused and its second stored. Nothing waiting on
/// such a write was told (what waits on a write also waits on every write before it, and the
/// one before it never stored), so skipping it loses nothing, while applying it would replay
/// records of a leadership without those before them. Messages are known by their ids:
/// `<epoch>.lead` for a mark, `<epoch>.<n>` for a write; one with neither was written without
/// a leadership and is applied, as is the first message read (what came before it is purged).
#[derive(Debug, Default)]
pub(crate) struct Writers {
    /// The newest epoch of a mark applied so far.
    newest: u64,
    /// The message read last: none before the first; applied (with its writer's epoch, if it
    /// has one) or skipped.
    previous: Option<Result<Option<u64>, ()>>,
}

/// Who wrote a journal message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    /// No leadership (an id that names none, or no id).
    Unknown,
    /// The mark of the leader of this epoch.
    Mark(u64),
    /// A write of the leader of this epoch.
    Write(u64),
}

impl Writer {
    /// The writer a message id names.
    pub(crate) fn of(id: Option<&str>) -> Self {
        let Some((epoch, n)) = id.and_then(|id| id.split_once('.')) else {
            return Self::Unknown;
        };
        match (epoch.parse(), n) {
            (Ok(epoch), "lead") => Self::Mark(epoch),
            (Ok(epoch), _) => Self::Write(epoch),
            (Err(_), _) => Self::Unknown,
        }
    }
}

impl Writers {
    /// Whether a replay applies the next message, written by `writer`.
    pub(crate) fn admit(&mut self, writer: Writer) -> bool {
        let applied = match writer {
            Writer::Unknown => true,
            Writer::Mark(epoch) => epoch >= self.newest,
            Writer::Write(epoch) => match self.previous {
                None | Some(Ok(None)) => true,
                Some(previous) => previous == Ok(Some(epoch)),
            },
        };
        let epoch = match writer {
            Writer::Unknown => None,
            Writer::Mark(epoch) | Writer::Write(epoch) => Some(epoch),
        };
        if let (Writer::Mark(epoch), true) = (writer, applied) {
            self.newest = epoch;
        }
        self.previous = Some(if applied { Ok(epoch) } else { Err(()) });
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::{Writer, Writers};

    fn admitted(ids: &[&str]) -> Vec<bool> {
        let mut writers = Writers::default();
        ids.iter()
            .map(|id| writers.admit(Writer::of(Some(id))))
            .collect()
    }

    #[test]
    fn a_message_id_names_its_writer() {
        assert_eq!(Writer::of(Some("4.lead")), Writer::Mark(4));
        assert_eq!(Writer::of(Some("4.17")), Writer::Write(4));
        assert_eq!(Writer::of(Some("x.17")), Writer::Unknown);
        assert_eq!(Writer::of(Some("417")), Writer::Unknown);
        assert_eq!(Writer::of(None), Writer::Unknown);
    }

    /// Epoch 1 leads with two writes in flight when epoch 2 marks: the first is refused, the
    /// second stored after the mark, and skipped; epoch 2's own first write is then refused
    /// and its second stored after epoch 1's, and skipped too, as is all that follows it of
    /// epoch 2; epoch 3's mark and writes are applied.
    #[test]
    fn a_replay_skips_each_write_stored_off_its_leaders_turn() {
        let ids = [
            "1.lead", "1.2", "2.lead", "1.5", "2.6", "2.7", "3.lead", "3.9",
        ];
        let expected = [true, true, true, false, false, false, true, true];
        assert_eq!(admitted(&ids), expected);
    }

    /// A mark older than one applied is skipped, and so are the writes that follow it.
    #[test]
    fn a_late_mark_of_an_older_leader_is_skipped_with_its_writes() {
        let ids = ["2.lead", "2.2", "1.lead", "1.4", "3.lead"];
        assert_eq!(admitted(&ids), [true, true, false, false, true]);
    }

    /// The first message read is applied whatever it is (what came before it was purged), and
    /// messages written without a leadership are applied.
    #[test]
    fn the_first_message_and_messages_without_a_leadership_are_applied() {
        assert_eq!(admitted(&["5.40", "5.41", "6.lead"]), [true, true, true]);
        assert_eq!(
            admitted(&["none", "7.3", "none", "8.9"]),
            [true, true, true, true]
        );
    }
}
