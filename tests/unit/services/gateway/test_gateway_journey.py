"""Journey's decisions: routed around before the first token (3 workers at most), migrated after it (up to the
limit), the tokens the next worker must hold, and going back once to workers that failed it."""

from services.gateway.journey import MAX_ROUTE_ATTEMPTS, Journey


def test_before_the_first_token_failures_route_around_up_to_the_attempt_limit():
    journey = Journey(max_migrations=3)
    assert [journey.may_continue(f"d{i}") for i in range(MAX_ROUTE_ATTEMPTS)] == [True, True, False]
    assert journey.excluded == ["d0", "d1", "d2"] and journey.num_migrations == 0


def test_after_it_each_failure_is_a_migration_until_the_limit():
    journey = Journey(max_migrations=2)
    journey.record((5, 6))
    assert journey.route_tokens([1, 2]) == [1, 2, 5, 6]
    assert journey.may_continue("d0") and journey.num_migrations == 1
    journey.record((7,))
    assert journey.may_continue("d1") and journey.num_migrations == 2
    assert not journey.may_continue("d2")
    assert journey.output_token_ids == [5, 6, 7] and journey.excluded == ["d0", "d1", "d2"]


def test_switched_off_a_started_request_never_moves():
    journey = Journey(max_migrations=0)
    assert journey.route_tokens([1]) == [1]
    journey.record((3,))
    assert not journey.may_continue("d0")


def test_failed_workers_are_readmitted_once_and_the_limits_still_hold():
    journey = Journey(max_migrations=3)
    assert not journey.readmit()  # nothing excluded: nothing to go back to
    assert journey.may_continue("d0") and journey.excluded == ["d0"]
    assert journey.readmit() and journey.excluded == []
    assert journey.may_continue("d0") and journey.excluded == ["d0"]
    assert not journey.readmit() and journey.excluded == ["d0"]  # once a request
    assert not journey.may_continue("d1")  # three failures before the first token, readmitted or not
    assert journey.num_failures == MAX_ROUTE_ATTEMPTS
