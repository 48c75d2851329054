"""Stop strings over deltas: never emitted, even split across deltas; a false alarm is released unchanged."""

from services.gateway.stop import StopMatcher


def run(stops, pieces) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    out = [matcher.push(p) for p in pieces]
    return [*out, matcher.flush()], matcher.is_stopped


def test_stop_split_across_deltas_is_held_then_cut():
    assert run(["o, w"], ["Hel", "lo,", " wo", "rld"]) == (["Hel", "l", "", "", ""], True)


def test_false_alarm_is_released_in_order():
    assert run(["abc"], ["xa", "b", "d"]) == (["x", "", "abd", ""], False)


def test_held_text_comes_out_at_the_end():
    assert run(["END"], ["the E", "N"]) == (["the ", "", "EN"], False)


def test_earliest_of_several_stops_wins():
    assert run(["world", "lo"], ["hello world"]) == (["hel", ""], True)
    assert run(["xyz", "ab"], ["..a", "b.."]) == (["..", "", ""], True)


def test_stop_at_the_very_start_and_nothing_after():
    matcher = StopMatcher(["STOP"])
    assert [matcher.push("STOP here"), matcher.push("more"), matcher.flush()] == ["", "", ""]


def test_multibyte_stop_strings():
    assert run(["😀"], ["Hi ", "😀", " there"]) == (["Hi ", "", "", ""], True)
    assert run(["中文"], ["a中", "文b"]) == (["a", "", ""], True)


def test_no_stops_passes_through():
    assert run([], ["a", "b"]) == (["a", "b", ""], False)


def test_overlapping_prefixes_hold_the_longest_candidate():
    # "aab" ends with "aa", a prefix of "aaa": hold back "aa" (not only "a")
    assert run(["aaa", "b!"], ["xaa", "ab"]) == (["x", "", ""], True)


def test_a_longer_stop_that_began_earlier_wins_over_a_shorter_one_already_complete():
    # "\n" is complete in "aa\n", but "a\na" may have begun at "a": hold until the next delta decides
    assert run(["\n", "a\na"], ["aa\n", "a"]) == (["a", "", ""], True)
    assert run(["\n", "a\na"], ["aa\n", "b"]) == (["a", "a", ""], True)  # it did not: "\n" cuts
    # the stream ends while it is undecided: the held text is cut at the earliest complete stop
    assert run(["\n", "a\nbc"], ["aa\nb"]) == (["a", "a"], True)
