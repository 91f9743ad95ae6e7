from pml_ingest.salience import salience


def test_dominant_early_heading_concept_scores_highest() -> None:
    assert salience(3, 3, 0, 100, True) == 1.0


def test_a_late_single_mention_beside_a_dominant_concept_is_below_the_covers_threshold() -> None:
    assert salience(1, 3, 90, 100, False) < 0.3


def test_bounds_and_monotonicity() -> None:
    assert salience(0, 3, 0, 100, True) == 0.0
    assert 0 <= salience(1, 1, 500, 10, False) <= 1
    assert salience(2, 4, 10, 100, False) > salience(1, 4, 10, 100, False)
    assert salience(1, 4, 10, 100, True) > salience(1, 4, 10, 100, False)
