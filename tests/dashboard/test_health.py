import pytest


@pytest.mark.django_db
def test_healthz_answers_200_anonymously_without_touching_the_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert (response.status_code, response.content) == (200, b"ok\n")
    assert response["Cache-Control"] == "no-store"


@pytest.mark.django_db
def test_healthz_refuses_a_post(client):
    assert client.post("/healthz").status_code == 405
