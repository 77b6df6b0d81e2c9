"""The suite's order (its slowest tests start first) and its clean-up of the shared
Redis (every key under a prefix a test made, deleted when the test ends: ``redis_keys``).

Under pytest-xdist each worker takes the next test as it finishes one
(``--maxschedchunk=1``, set below), so a 30-s test that comes last in
the collection runs alone at the end while the other workers idle (35 s of a
300-s run, measured). Started first, the long tests overlap one another and
the many short ones fill the gaps at the end. A name here only moves a test
up the order: one renamed or removed costs a few seconds, never a verdict.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from redis_keys import delete_made

#: Tests (a node id, or the start of one: every parametrization), slowest first:
#: the forty slowest of a whole run under ``-n 3`` at load 9 (2026-11-28), then
#: the others that took 2.5 s or more in an earlier quiet run. Most start a
#: process or a real server, or crawl for a set time.
SLOWEST_FIRST = (
    "test_benchmarks_run.py::test_overhead_count_engine",
    "test_httpx_adapter.py::test_a_thousand_hosts_leave_no_pool_and_little_memory_once_forgotten",
    "test_adapter_surface.py::test_a_users_script_type_checks_and_its_mistakes_are_caught",
    "test_benchmarks_run.py::test_adaptive_beside_scrapy",
    "test_redis.py::test_forgotten_slots_leave_nothing_behind_in_the_store",
    "test_fetch.py::test_ten_thousand_urls_on_fifty_hosts_one_line_each_through_a_sigint",
    "test_concurrency_model.py::test_random_interleavings_keep_every_promise",
    "test_plain_response.py::test_the_adaptive_step_is_its_documented_rule",
    "test_headers.py::test_property_names_are_read_in_any_case",
    "test_header_dialects.py::test_property_hostile_dialect_values_never_give_a_bad_budget",
    "test_benchmarks_run.py::test_overhead_bytecodes",
    "test_scheduling.py::test_driver_no_leak_after_thousands_of_cancellations",
    "test_concurrency_model_threads.py::test_threads_keep_every_promise",
    "test_benchmarks_run.py::test_fetch_images",
    "test_benchmarks_run.py::test_crawl_10k",
    "test_fleet_model.py::test_random_scripts_keep_the_fleets_promises",
    "test_redis_cluster.py::test_four_processes_on_a_cluster_keep_the_pace_of_one",
    "test_redis.py::test_four_processes_keep_the_pace_of_one",
    "test_headers.py::test_property_rate_limit",
    "test_cli.py::test_demo_short_run",
    "test_fetch_cli.py::test_invalid_utf8_gives_one_valid_json_line_and_reruns_add_none",
    "test_benchmarks_run.py::test_fetch",
    "test_scrapy.py::test_a_state_file_carries_what_was_learned_to_the_next_run",
    "test_scrapy.py::test_two_spider_processes_share_one_pace_through_redis",
    "test_headers.py::test_property_read_headers_agrees_and_notes_stay_short",
    "test_docs.py::test_the_readmes_quickstarts_run_as_scripts_against_a_loopback_host",
    "test_benchmarks_run.py::test_redis_store",
    "test_fetch_cli.py::test_sigterm_exits_143_and_sigint_130",
    "test_benchmarks_run.py::test_overhead_by_the_clock",
    "test_lag.py::test_an_idle_client_measures_no_lag",
    "test_benchmarks_run.py::test_adaptive_defaults_and_soft_blocks",
    "test_lag.py::test_a_loaded_client_still_finds_the_hosts_capacity",
    "test_fetch_cli.py::test_a_captcha_wall_is_seen_counted_backed_off_and_retried",
    "test_fast_grant.py::test_the_short_way_and_the_general_one_leave_the_same_state",
    "test_headers.py::test_property_cache",
    "test_benchmarks_run.py::test_many_hosts_with_the_wire_truth",
    "test_fetch_cli.py::test_a_utf8_file_with_a_byte_order_mark_reads_its_first_url",
    "test_fetch_cli.py::test_dash_o_dash_streams_to_stdout_with_no_resume",
    "test_headers.py::test_property_retry_after",
    "test_fetch.py::test_a_host_that_refuses_is_retried_within_the_bound_and_paced",
    "test_scrapy.py::test_rate_limit_headers_keep_the_crawl_under_the_limit",
    "test_benchmarks_run.py::test_wire_gap",
    "test_benchmarks_run.py::test_every_flag_the_docs_give_a_benchmark_is_in_its_help",
    "test_store_file.py::test_a_second_run_from_the_saved_file_is_refused_less",
    "test_benchmarks_run.py::test_redis_store_trace",
    "test_redis_cluster.py::test_a_pause_set_on_any_shard_reaches_a_process_holding_turns",
    "test_signals_wire.py::test_token_bucket_with_retry_after_only_settles_near_its_rate",
    "test_benchmarks_run.py::test_compose",
    "test_httpx_pools.py::test_a_request_that_fails_or_is_cancelled_gives_its_pool_back",
    "test_scrapy.py::test_closing_mid_crawl_gives_waiting_requests_back_and_holds_nothing",
    "test_redis_cluster.py::test_slots_spread_over_the_shards_each_pace_as_on_one_redis",
    "test_redis.py::test_a_worker_killed_mid_request_gives_its_share_back_when_its_lease_expires",
    "test_first_script.py::test_gather_over_200_urls_of_one_host_with_aiohttp",
    "test_scrapy.py::test_a_refused_connection_is_a_failure_that_backs_off",
    "test_redis_rules.py::test_the_last_sync_request_timed_out_in_its_process_queue_hands_the_run_back",
    "test_cli.py::test_timeline_plot_writes_a_png",
    "test_redis.py::test_a_process_that_stood_still_is_not_taken_for_a_slow_redis",
    "test_scrapy.py::test_a_block_pattern_backs_off_without_code",
    "test_redis.py::test_sync_clients_in_threads_keep_the_fleets_pace",
    "test_docs.py::test_the_timeline_example_of_docs_cli_runs_as_a_script",
    "test_fetch_cli.py::test_block_status_marks_a_status_as_a_block",
    "test_benchmarks_run.py::test_llm",
    "test_policies.py::test_adaptive_concurrency_finds_the_host_capacity",
    "test_aiohttp_adapter.py::test_the_middleware_ends_every_outcome_as_the_skeleton_does",
    "test_signals_wire.py::test_rate_limit_headers_keep_the_rate_within_budget",
    "test_benchmarks_run.py::test_many_hosts_new_hosts",
    "test_scrapy.py::test_a_request_held_up_after_its_wire_turn_pushes_the_next_one_back",
    "test_docs.py::test_every_example_runs",
    "test_redis_rules.py::test_the_last_request_given_up_in_its_process_queue_hands_the_run_back",
    "test_aiohttp_connector.py::test_a_long_wire_wait_hands_the_connection_back_to_the_connector",
    "test_llm_sdks.py::test_a_spent_request_budget_holds_the_next_request",
    "test_scrapy.py::test_a_crawl_is_paced_at_the_host_by_the_throttle_alone",
    "test_benchmarks_run.py::test_many_hosts_adaptive",
    "test_docs.py::test_the_timeline_on_disk_example_runs_and_names_a_slot_it_never_saw",
    "test_plot.py::test_the_legend_lists_only_the_lines_drawn",
    "test_fetch_cli.py::test_robots_txt_is_obeyed_read_once_per_host_and_its_delay_is_the_floor",
    "test_scrapy.py::test_the_delay_adapts_to_download_latency",
    "test_scrapy.py::test_per_request_options_from_meta_and_the_header",
    "test_skeleton.py::test_an_error_of_the_wire_turn_leaves_nothing_for_the_collector",
    "test_scrapy.py::test_a_429_with_retry_after_pauses_the_slot_and_the_retry_waits",
    "test_plain_response.py::test_the_fast_path_and_the_rules_leave_the_same_state",
    "test_scrapy_tls.py::test_a_slow_handshake_is_in_the_first_latency_and_its_delay_halves_away",
    "test_scrapy_tls.py::test_the_pace_holds_at_the_host_but_a_slow_handshake_comes_out_of_the_gap_after_it",
)


def _rank(nodeid: str) -> int:
    """Where the test stands in ``SLOWEST_FIRST``; after all of them if not there."""
    path, _, test = nodeid.partition("::")
    name = f"{path.rpartition('/')[2]}::{test}"
    for rank, start in enumerate(SLOWEST_FIRST):
        if name.startswith(start) and name[len(start) : len(start) + 1] in ("", "["):
            return rank
    return len(SLOWEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest first; the rest in the order collected (a stable sort)."""
    items.sort(key=lambda item: _rank(item.nodeid))


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n``, hand each worker one test at a time (xdist's ``--maxschedchunk=1``,
    unless given): its next when it has done one, longest first. Set here, not in
    ``addopts``, so that a run without xdist (``-p no:xdist``, as the mutation runs
    of scripts/mutants.py) still parses its command line."""
    if getattr(config.option, "maxschedchunk", 0) is None:  # xdist there, no value given
        config.option.maxschedchunk = 1
    # No current event loop until a test's runner sets one: looptime's plugin asks
    # the policy for the current loop before every test, synchronous ones too, and
    # a policy never told otherwise makes one there, which nothing closes (a
    # DeprecationWarning from CPython 3.12, an unclosed-loop ResourceWarning when it
    # is dropped). Told "none", the policy raises instead, which looptime expects
    # (as on 3.14, where that is the rule): tests/test_event_loops.py.
    asyncio.set_event_loop(None)


@pytest.fixture(autouse=True)
def _redis_keys_deleted() -> Iterator[None]:
    """Every key under a prefix the test made (``redis_keys.fresh_prefix``) deleted
    once it is done: set up first, this fixture is torn down last."""
    yield
    delete_made()
