"""Salience of a concept in a section (the `salience` of `MENTIONED_IN`), in [0, 1].

    salience = 0.5 · count / max_count  +  0.3 · (1 − first_offset / section_length)
               + 0.2 · [the concept is named in the section's heading trail]

`count` is how often the concept is mentioned in the section and `max_count` the count of the
section's most mentioned concept (term frequency, normalised within the section); the second
term rewards concepts introduced early (a section's subject comes first); the third rewards a
concept its headings name. A concept mentioned once, late, in a section dominated by another
scores below 0.3, the default `covers_min_salience` of Pass 2a.
"""

from __future__ import annotations

W_FREQUENCY = 0.5
W_POSITION = 0.3
W_HEADING = 0.2


def salience(
    count: int, max_count: int, first_offset: int, section_length: int, in_heading: bool
) -> float:
    if count <= 0 or max_count <= 0:
        return 0.0
    frequency = min(1.0, count / max_count)
    position = 1.0 - min(1.0, max(0, first_offset) / max(1, section_length))
    value = W_FREQUENCY * frequency + W_POSITION * position + W_HEADING * float(in_heading)
    return round(min(1.0, max(0.0, value)), 4)
