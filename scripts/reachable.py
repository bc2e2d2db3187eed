"""Exit 0 when the PostgreSQL URL and the Redis URL given both answer; else say why."""

import sys

import psycopg
import redis


def main(database_url, redis_url):
    try:
        psycopg.connect(database_url, connect_timeout=3).close()
    except psycopg.Error as error:
        print(f"PostgreSQL at {database_url} is not reachable: {error}".strip(), file=sys.stderr)
        return 1
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as error:
        print(f"Redis at {redis_url} is not reachable: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
