"""The JVM options of an :class:`events.dev.apache_kafka.ApacheKafka` node, as Kafka's scripts take them."""

from __future__ import annotations

from events.dev.apache_kafka import JVM_OPTIONS, PERFORMANCE_OPTIONS_ENV, jvm_options


def test_without_the_variable_a_node_has_kafka_s_own_defaults() -> None:
    assert (*JVM_OPTIONS, "-XX:+ExitOnOutOfMemoryError") == jvm_options({})
    assert "-XX:+UseG1GC" in jvm_options({})


def test_kafka_jvm_performance_opts_replaces_the_defaults_whole_split_as_a_shell_would() -> None:
    options = jvm_options({PERFORMANCE_OPTIONS_ENV: "-XX:TieredStopAtLevel=1  -XX:+UseSerialGC -Dname='a b'"})

    assert (
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Dname=a b",
        "-XX:+ExitOnOutOfMemoryError",
    ) == options


def test_an_empty_variable_counts_as_unset() -> None:
    assert jvm_options({}) == jvm_options({PERFORMANCE_OPTIONS_ENV: ""})
