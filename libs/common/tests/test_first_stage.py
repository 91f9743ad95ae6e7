"""The first stage's tokenizer, BM25 index and fusion."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pml_common.first_stage import (
    CJK,
    DENSE_WEIGHTS,
    FOREIGN_SCRIPT_SHARE,
    LATIN,
    MAX_SUB_GOALS,
    PRODUCT_BLOCK_ROWS,
    SUB_GOAL_SHARE,
    LexicalIndex,
    Reach,
    ToolText,
    dense_parts,
    fused_relevance,
    min_max,
    part_cosines,
    retriever_problem,
    schema_fields,
    script,
    sub_goals,
    tokenize,
    with_sub_goals,
)

ACROSS = Reach.CROSS_SCRIPT
#: How far the default tool embedder's models read: USE, e5, MiniLM.
READS = (ACROSS, Reach.MULTILINGUAL, Reach.ENGLISH)


def test_identifiers_split_at_snake_kebab_and_camel_boundaries() -> None:
    assert tokenize("getWalletBalance") == ["get", "wallet", "balanc"]
    assert tokenize("read_file get-latest-blocks") == ["read", "file", "get", "latest", "block"]
    assert tokenize("HTTPRequest") == ["http", "request"]


def test_stop_words_go_and_english_is_stemmed() -> None:
    assert tokenize("Lists the files of the repositories") == ["list", "file", "repositori"]


def test_chinese_runs_become_character_bigrams() -> None:
    assert tokenize("读取文件") == ["读取", "取文", "文件"]
    assert tokenize("查 a file") == ["file", "查"]


def test_schema_fields_are_the_top_level_properties() -> None:
    schema = {"type": "object", "properties": {"app": {}, "newName": {}}}
    assert schema_fields(schema) == ("app", "newName")
    assert schema_fields(None) == ()
    assert schema_fields({"properties": ["not", "a", "dict"]}) == ()


def test_bm25_ranks_the_tool_whose_words_the_query_uses() -> None:
    docs = [
        ToolText("a:send", "mail", "send_email", "Send an email to a recipient"),
        ToolText("b:rename", "heroku", "rename_app", "Rename an application", ("newName",)),
        ToolText("c:list", "fs", "list_files", "List files in a folder"),
    ]
    index = LexicalIndex.build(docs)
    scores = index.scores("give my heroku app a new name")
    assert int(np.argmax(scores)) == 1
    assert index.scores("zzz unknown words").tolist() == [0.0, 0.0, 0.0]
    assert len(LexicalIndex.build([]).scores("anything")) == 0


@given(
    st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=20),
    st.lists(st.floats(0.0, 50.0), min_size=20, max_size=20),
)
def test_fused_relevance_lies_in_the_unit_interval(dense: list[float], bm25: list[float]) -> None:
    lexical = np.asarray(bm25[: len(dense)], dtype=np.float32)
    fused = fused_relevance(np.asarray(dense, dtype=np.float32), lexical)
    assert fused.shape == (len(dense),)
    assert np.all(fused >= 0.0) and np.all(fused <= 1.0 + 1e-6)


def test_fusion_weighs_min_max_dense_parts_and_relative_bm25() -> None:
    use = np.array([0.8, 0.2, 0.5])
    e5 = np.array([0.80, 0.90, 0.85])  # e5 cosines crowd together: min-max spreads them
    bm25 = np.array([2.0, 4.0, 0.0])
    fused = fused_relevance(np.vstack([use, e5]), bm25)
    w_use, w_e5 = DENSE_WEIGHTS[2]
    lexical = 1 - w_use - w_e5
    expected = [w_use * 1.0 + lexical * 0.5, w_e5 * 1.0 + lexical, w_use * 0.5 + w_e5 * 0.5]
    assert fused.tolist() == pytest.approx(expected, abs=1e-6)
    # One model: its weight and the lexical rest.
    (w,) = DENSE_WEIGHTS[1]
    assert fused_relevance(use, bm25).tolist() == pytest.approx(
        [w + (1 - w) * 0.5, 1 - w, w * 0.5], abs=1e-6
    )


def test_a_texts_script_is_the_one_most_of_its_words_are_in() -> None:
    assert script("Read a file") == "latin"
    assert script("Crème brûlée recipes") == "latin"
    assert script("读取文件的内容") == "cjk"
    assert script("ファイルを読む") == "cjk"
    # Latin letters outnumber the Chinese characters, but not the words they make.
    assert (
        script("分析 ClinicalTrials.gov 上临床试验的入选标准。示例输入：nctid NCT05859269") == "cjk"
    )
    assert script("Montre-moi 天气 weather for Paris") == "latin"
    assert script("Прочитать файл") == "cyrillic"
    assert script("2024 …") == "latin"
    assert ToolText("a:b", "a", "read_file", "读取文件").script() == "cjk"
    assert ToolText("a:b", "a", "读取", "").script() == "cjk"


def test_the_index_names_the_tools_in_another_script_than_the_text() -> None:
    docs = [
        ToolText("a:weather", "a", "forecast", "未来几天的天气预报"),
        ToolText("b:news", "b", "headlines", "The latest news headlines"),
        ToolText("c:mail", "c", "send", "Send an email"),
    ]
    index = LexicalIndex.build(docs)
    assert index.foreign("Will it rain tomorrow?").tolist() == [True, False, False]
    assert index.foreign("Завтра будет дождь?").tolist() == [True, True, True]
    # A request in the catalog's minority script: every tool is judged as a foreign one,
    # the tools in its own script too.
    assert index.foreign("明天会下雨吗").tolist() == [True, True, True]
    chinese = LexicalIndex.build(chinese_docs())
    assert chinese.foreign("明天会下雨吗") is None
    assert chinese.foreign("Will it rain tomorrow?").tolist() == [True, True]
    mostly_chinese = LexicalIndex.build([*chinese_docs(), docs[1]])
    assert mostly_chinese.foreign("明天会下雨吗").tolist() == [False, False, True]
    english = LexicalIndex.build(docs[1:])
    assert english.foreign("Will it rain tomorrow?") is None


def chinese_docs() -> list[ToolText]:
    return [
        ToolText("a:weather", "a", "forecast", "未来几天的天气预报"),
        ToolText("d:news", "d", "headlines", "最新新闻头条"),
    ]


def test_a_tool_in_another_script_is_judged_in_part_by_the_models_that_read_across() -> None:
    use = np.array([0.9, 0.1, 0.5])
    e5 = np.array([0.7, 0.9, 0.8])
    minilm = np.array([0.0, 1.0, 0.5])  # English only: blind to tool 0's Chinese description
    bm25 = np.array([0.0, 3.0, 1.0])
    dense = np.vstack([use, e5, minilm])
    foreign = np.array([True, False, False])
    plain = fused_relevance(dense, bm25)
    w_use, w_e5, _ = DENSE_WEIGHTS[3]
    share = FOREIGN_SCRIPT_SHARE
    # Tool 0, USE alone reading across scripts: its fused relevance blended with USE's min-max
    # score (1).
    fused = fused_relevance(dense, bm25, foreign, reach=READS)
    assert fused[0] == pytest.approx((1 - share) * plain[0] + share * 1.0)
    assert fused[0] > plain[0]
    assert fused[1:].tolist() == pytest.approx(plain[1:].tolist())
    # USE and e5: their min-max scores (1 and 0), weights scaled to sum to one.
    both = fused_relevance(dense, bm25, foreign, reach=(ACROSS, ACROSS, Reach.ENGLISH))
    assert both[0] == pytest.approx((1 - share) * plain[0] + share * w_use / (w_use + w_e5))
    # No model reads across scripts: the weights stay as they are.
    many = (Reach.MULTILINGUAL, Reach.MULTILINGUAL, Reach.ENGLISH)
    none = fused_relevance(dense, bm25, foreign, reach=many)
    assert none.tolist() == pytest.approx(plain.tolist())
    # Unknown models are taken to read across scripts: only BM25 is left out.
    every = w_use / sum(DENSE_WEIGHTS[3])
    assert fused_relevance(dense, bm25, foreign)[0] == pytest.approx(
        (1 - share) * plain[0] + share * every
    )


def test_a_model_that_reads_english_only_has_no_say_for_a_text_in_another_script() -> None:
    use = np.array([0.9, 0.1, 0.5])
    e5 = np.array([0.7, 0.9, 0.8])
    minilm = np.array([0.0, 1.0, 0.5])
    bm25 = np.array([0.0, 3.0, 1.0])
    dense = np.vstack([use, e5, minilm])
    w_use, w_e5, w_minilm = DENSE_WEIGHTS[3]
    kept = 1 - w_minilm
    chinese = fused_relevance(dense, bm25, None, CJK, reach=READS)
    alone = fused_relevance(dense[:2], bm25, weights=(w_use / kept, w_e5 / kept))
    assert chinese.tolist() == pytest.approx(alone.tolist())
    assert chinese.tolist() != pytest.approx(fused_relevance(dense, bm25, reach=READS).tolist())
    # In Latin script, or when every model reads English only, nothing is left out.
    latin = fused_relevance(dense, bm25, None, LATIN, reach=READS)
    assert latin.tolist() == pytest.approx(fused_relevance(dense, bm25).tolist())
    english = (Reach.ENGLISH,) * 3
    assert fused_relevance(dense, bm25, None, CJK, reach=english).tolist() == pytest.approx(
        fused_relevance(dense, bm25).tolist()
    )
    # Every tool foreign to the text: blended with USE's relevance, MiniLM still left out.
    foreign = np.ones(3, dtype=bool)
    blended = fused_relevance(dense, bm25, foreign, CJK, reach=READS)
    share = FOREIGN_SCRIPT_SHARE
    want = (1 - share) * alone + share * min_max(use)
    assert blended.tolist() == pytest.approx(want.tolist())


def test_min_max_keeps_a_lone_score_as_it_is() -> None:
    assert min_max(np.array([0.3, 0.7])).tolist() == pytest.approx([0.0, 1.0])
    assert min_max(np.array([0.42])).tolist() == pytest.approx([0.42])


def test_dense_parts_read_each_models_cosine_back() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    joined = np.hstack([a, b]) / np.sqrt(2)
    parts = dense_parts(joined[1:], joined[0], (3, 2))
    np.testing.assert_allclose(parts[0], a[1:] @ a[0], rtol=1e-5)
    np.testing.assert_allclose(parts[1], b[1:] @ b[0], rtol=1e-5)


# Fewer rows than a block, exactly two blocks, blocks and a remainder.
@pytest.mark.parametrize("count", [7, 2 * PRODUCT_BLOCK_ROWS, 2 * PRODUCT_BLOCK_ROWS + 45])
def test_part_cosines_of_several_queries_are_each_querys_own(count: int) -> None:
    rng = np.random.default_rng(1)
    rows, queries = rng.normal(size=(count, 5)), rng.normal(size=(3, 5))
    models = [np.ascontiguousarray(rows[:, :3]), np.ascontiguousarray(rows[:, 3:])]
    together = part_cosines(models, queries)
    assert together.shape == (2, 3, count)
    for j, query in enumerate(queries):
        np.testing.assert_allclose(together[:, j], dense_parts(rows, query, (3, 2)), rtol=1e-5)


def test_retriever_names() -> None:
    assert retriever_problem("") is None
    assert retriever_problem("lexical") is None
    assert "must be one of" in (retriever_problem("bm42") or "")


def test_a_chained_request_splits_into_its_steps() -> None:
    query = (
        "First, can you check my current balance on Goerli? Then, proceed with the "
        "transaction if the balance is sufficient, and finally email me the receipt please."
    )
    assert sub_goals(query) == [
        "First, can you check my current balance on Goerli?",
        "Then, proceed with the transaction if the balance is sufficient",
        "email me the receipt please.",
    ]
    assert sub_goals("read the file named notes.txt") == []
    assert len(sub_goals("Do step one now. " * 50)) == MAX_SUB_GOALS


def test_a_chained_request_in_chinese_or_japanese_splits_into_its_steps() -> None:
    query = "扫描main.py文件的内容，接着获取详细结果，再检查扫描状态。最后列出支持的语言"
    assert sub_goals(query) == [
        "扫描main.py文件的内容",
        "获取详细结果",
        "检查扫描状态。",
        "最后列出支持的语言",
    ]
    # "最后" ("last") and "再" ("again") start a step only after a comma.
    assert sub_goals("列出最后一个文件并再检查一次它的大小") == []
    # A fragment of fewer than three words (4.5 characters) is not a step.
    assert sub_goals("谢谢。帮我查一下北京明天的天气") == []
    assert sub_goals("ファイルを読み込んでください。それから要約を作成してください") == [
        "ファイルを読み込んでください。",
        "要約を作成してください",
    ]


def test_sub_goals_blend_the_best_step_into_each_tools_relevance() -> None:
    whole = np.array([0.9, 0.2, 0.1], dtype=np.float32)
    steps = [np.array([0.8, 0.1, 0.0]), np.array([0.1, 0.9, 0.3])]
    blended = with_sub_goals(whole, steps)
    share = SUB_GOAL_SHARE
    expected = [(1 - share) * 0.9 + share * 0.8, (1 - share) * 0.2 + share * 0.9, 0.2]
    assert blended.tolist() == pytest.approx(expected)
    assert with_sub_goals(whole, []) is whole
