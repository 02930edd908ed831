"""Hand-written sentences (common proverbs and everyday remarks) mixed into the raw corpus.

They give the generated text some natural variety (other tenses, persons, punctuation, elision).
They are not part of the parallel subset and are not translations of each other.
"""
from __future__ import annotations

HANDWRITTEN: dict[str, tuple[str, ...]] = {
    "en": (
        "Practice makes perfect.", "An apple a day keeps the doctor away.", "The early bird catches the worm.",
        "Better late than never.", "Every cloud has a silver lining.", "Actions speak louder than words.",
        "Home is where the heart is.", "A friend in need is a friend indeed.", "Look before you leap.",
        "Rome was not built in a day.", "Two heads are better than one.", "Still waters run deep.",
        "After the rain comes the sun.", "It is never too late to learn.", "A good book is a good friend.",
        "Don't put all your eggs in one basket.", "We usually have breakfast at seven o'clock.",
        "The shop on the corner opens at nine.", "My neighbour waters her flowers every evening.",
        "The weather is nice today, so we will walk to the park.", "Please close the window when it rains.",
        "Children love stories about animals.", "The train to the city leaves every hour.",
        "There is no place like home.", "Slow and steady wins the race.",
    ),
    "fr": (
        "Petit à petit, l'oiseau fait son nid.", "Après la pluie, le beau temps.", "Qui vivra verra.",
        "L'habit ne fait pas le moine.", "Mieux vaut tard que jamais.", "Les bons comptes font les bons amis.",
        "Chaque chose en son temps.", "Il n'y a pas de fumée sans feu.", "Paris ne s'est pas fait en un jour.",
        "Rien ne sert de courir, il faut partir à point.", "Qui se ressemble s'assemble.",
        "La nuit porte conseil.", "Quand le chat n'est pas là, les souris dansent.",
        "L'appétit vient en mangeant.", "Il vaut mieux prévenir que guérir.",
        "Un tiens vaut mieux que deux tu l'auras.", "Nous prenons le petit déjeuner à sept heures.",
        "La boulangerie du quartier ouvre tôt le matin.", "Mon voisin arrose ses fleurs tous les soirs.",
        "Il fait beau aujourd'hui, allons nous promener au parc.", "Les enfants aiment les histoires d'animaux.",
        "Le train pour Lyon part toutes les heures.", "On n'est jamais si bien que chez soi.",
    ),
    "de": (
        "Übung macht den Meister.", "Morgenstund hat Gold im Mund.", "Aller Anfang ist schwer.",
        "Ende gut, alles gut.", "Wer zuletzt lacht, lacht am besten.", "Ohne Fleiß kein Preis.",
        "Der Apfel fällt nicht weit vom Stamm.", "Besser spät als nie.", "Lügen haben kurze Beine.",
        "Rom wurde nicht an einem Tag erbaut.", "Viele Köche verderben den Brei.",
        "Wer nicht wagt, der nicht gewinnt.", "Nach dem Regen kommt die Sonne.", "Kleider machen Leute.",
        "Stille Wasser sind tief.", "Was du heute kannst besorgen, das verschiebe nicht auf morgen.",
        "Wir frühstücken meistens um sieben Uhr.", "Die Bäckerei an der Ecke öffnet um sechs Uhr.",
        "Meine Nachbarin gießt jeden Abend ihre Blumen.", "Heute ist schönes Wetter, wir gehen in den Park.",
        "Kinder lieben Geschichten über Tiere.", "Der Zug nach Hamburg fährt jede Stunde.",
    ),
    "ru": (
        "Тише едешь — дальше будешь.", "Без труда не выловишь и рыбку из пруда.",
        "Лучше поздно, чем никогда.", "Век живи — век учись.",
        "Не откладывай на завтра то, что можно сделать сегодня.", "Москва не сразу строилась.",
        "Старый друг лучше новых двух.", "Утро вечера мудренее.", "Делу время, потехе час.",
        "Повторение — мать учения.", "Не имей сто рублей, а имей сто друзей.",
        "Глаза боятся, а руки делают.", "Друзья познаются в беде.", "Хорошая книга — лучший друг.",
        "Аппетит приходит во время еды.", "Мы обычно завтракаем в семь часов.",
        "Магазин на углу открывается в девять.", "Соседка каждый вечер поливает цветы.",
        "Сегодня хорошая погода, пойдём гулять в парк.", "Дети любят сказки о животных.",
        "Поезд в Петербург уходит каждый час.",
    ),
    "ar": (
        "الصبر مفتاح الفرج.", "العلم نور.", "من جد وجد.", "الوقت كالسيف إن لم تقطعه قطعك.",
        "الصديق وقت الضيق.", "في التأني السلامة.", "خير الكلام ما قل ودل.",
        "اطلب العلم من المهد إلى اللحد.", "القراءة غذاء العقل.", "لكل مجتهد نصيب.",
        "خير جليس في الزمان كتاب.", "الجار قبل الدار.", "العقل السليم في الجسم السليم.",
        "بعد المطر تشرق الشمس.", "نتناول الفطور عادة في الساعة السابعة.",
        "يفتح المخبز أبوابه في الصباح الباكر.", "تسقي جارتي الزهور كل مساء.",
        "الطقس جميل اليوم، فلنذهب إلى الحديقة.", "يحب الأطفال القصص عن الحيوانات.",
        "يغادر القطار إلى المدينة كل ساعة.",
    ),
    "hi": (
        "जैसी करनी वैसी भरनी।", "बूँद-बूँद से घड़ा भरता है।", "जल्दी का काम शैतान का।",
        "दूर के ढोल सुहावने होते हैं।", "जहाँ चाह वहाँ राह।", "एक और एक ग्यारह होते हैं।",
        "मेहनत का फल मीठा होता है।", "स्वास्थ्य ही सबसे बड़ा धन है।", "समय बहुत कीमती है।",
        "अच्छी किताबें सच्चे दोस्त होती हैं।", "सुबह की सैर सेहत के लिए अच्छी होती है।",
        "बारिश के बाद आसमान साफ़ हो जाता है।", "हम आम तौर पर सात बजे नाश्ता करते हैं।",
        "कोने की दुकान नौ बजे खुलती है।", "मेरी पड़ोसन हर शाम फूलों को पानी देती है।",
        "आज मौसम अच्छा है, चलो पार्क में टहलने चलें।", "बच्चों को जानवरों की कहानियाँ पसंद हैं।",
        "शहर जाने वाली ट्रेन हर घंटे चलती है।",
    ),
    "zh": (
        "熟能生巧。", "一日之计在于晨。", "三人行，必有我师。", "千里之行，始于足下。", "失败是成功之母。",
        "活到老，学到老。", "时间就是金钱。", "百闻不如一见。", "好好学习，天天向上。",
        "书是人类进步的阶梯。", "我们通常七点吃早饭。", "街角的商店九点开门。",
        "我的邻居每天晚上给花浇水。", "今天天气很好，我们去公园散步吧。", "孩子们喜欢关于动物的故事。",
        "去城里的火车每小时一班。",
    ),
}
