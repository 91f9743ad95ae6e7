import redis
from neo4j import GraphDatabase

from pml_common.local_runtime import ManagedProcess


def test_redis_server_answers(redis_server: ManagedProcess) -> None:
    client = redis.Redis.from_url(redis_server.url)
    assert client.ping() is True
    assert client.info("server")["redis_version"]


def test_neo4j_server_is_526_community(neo4j_server: ManagedProcess) -> None:
    with GraphDatabase.driver(neo4j_server.url, auth=None) as driver:
        records, _, _ = driver.execute_query(
            "CALL dbms.components() YIELD name, versions, edition RETURN name, versions, edition"
        )
    row = records[0]
    assert row["versions"][0].startswith("5.26."), row
    assert row["edition"] == "community"
