//! Plain-text tables for people (`-o json` bypasses them).

/// Renders rows under headers, columns padded to their widest cell;
/// columns whose header starts with `>` are right-aligned (numbers).
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let names: Vec<&str> = headers.iter().map(|h| h.trim_start_matches('>')).collect();
    let right: Vec<bool> = headers.iter().map(|h| h.starts_with('>')).collect();
    let mut widths: Vec<usize> = names.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            let pad = w.saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
            }
            if right.get(i).copied().unwrap_or(false) {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                if i + 1 < cells.len() {
                    out.push_str(&" ".repeat(pad));
                }
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(&names);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_and_aligns() {
        let out = render(
            &["NAME", ">COUNT"],
            &[
                vec!["a".into(), "5".into()],
                vec!["long-name".into(), "12345".into()],
            ],
        );
        assert_eq!(
            out,
            "NAME       COUNT\na              5\nlong-name  12345\n"
        );
    }
}
